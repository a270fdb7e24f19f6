// A hand-driven data plane client for tests that write frames byte by byte: it records
// what D answers (ERROR and ACK frames) and whether D hung up.
import type { Socket } from "bun";
import { decodeReply, frameBytes } from "../../src/transfer/wire/index.ts";

export interface RawConn {
  socket: Socket<undefined>;
  errors: { code: number; message: string }[];
  acks: { blocksReceived: number; blocksDeduped: number; payloadBytes: bigint; nTokens: number }[];
  closed: boolean;
}

export async function rawConnect(address: string): Promise<RawConn> {
  const i = address.lastIndexOf(":");
  const conn: RawConn = { socket: undefined as unknown as Socket<undefined>, errors: [], acks: [], closed: false };
  let acc: Uint8Array = new Uint8Array(0);
  conn.socket = await Bun.connect({
    hostname: address.slice(0, i),
    port: Number(address.slice(i + 1)),
    socket: {
      data(_s, buf) {
        acc = concat(acc, buf);
        while (acc.length >= 4 && acc.length >= frameBytes(acc, 0)) {
          const len = frameBytes(acc, 0);
          const r = decodeReply(acc.subarray(0, len));
          if (r.kind === "error") conn.errors.push({ code: r.code, message: r.message });
          if (r.kind === "ack") conn.acks.push(r.ack);
          acc = acc.slice(len);
        }
      },
      close() {
        conn.closed = true;
      },
      error() {
        conn.closed = true;
      },
    },
  });
  conn.socket.setNoDelay(true);
  return conn;
}

/** Bun's socket.write takes what the kernel takes now: the rest is written after a pause. */
export async function writeAll(s: Socket<undefined>, b: Uint8Array): Promise<void> {
  for (let off = 0; off < b.length; ) {
    const w = s.write(b.subarray(off));
    if (w < 0) throw new Error("raw socket closed");
    off += w;
    if (off < b.length) await Bun.sleep(1);
  }
}

export function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
