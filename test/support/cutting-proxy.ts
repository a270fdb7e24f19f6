// A TCP proxy that forwards a connection faithfully until the client has sent
// `cutAfterBytes` bytes, then resets both sides: a network failure mid-transfer.
import * as net from "node:net";

export interface CuttingProxy {
  /** host:port to dial instead of the target */
  readonly address: string;
  readonly port: number;
  /** connections cut so far */
  cuts(): number;
  close(): Promise<void>;
}

/** Connects to `target` (host:port, or a function giving it as a connection arrives; IPv6 hosts in brackets). */
export function connectUpstream(target: string | (() => string)): net.Socket {
  const to = typeof target === "function" ? target() : target;
  const i = to.lastIndexOf(":");
  return net.connect({ host: to.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(to.slice(i + 1)) });
}

/** A reset, not a FIN, on both sides: each peer must see a broken stream, not a clean end. */
export function resetBoth(a: net.Socket, b: net.Socket): void {
  for (const s of [a, b]) {
    try {
      s.resetAndDestroy();
    } catch {
      s.destroy();
    }
  }
}

/**
 * `target` is host:port, or a function giving it when a connection arrives (a target
 * started after the proxy). Only the first `maxCuts` connections (default: all) are cut.
 */
export async function startCuttingProxy(target: string | (() => string), opts: { cutAfterBytes: number; maxCuts?: number }): Promise<CuttingProxy> {
  const sockets = new Set<net.Socket>();
  let cut = 0;
  let conns = 0;
  const server = net.createServer((client) => {
    const upstream = connectUpstream(target);
    sockets.add(client);
    sockets.add(upstream);
    const kill = () => resetBoth(client, upstream);
    let sent = 0;
    const limit = conns++ < (opts.maxCuts ?? Infinity) ? opts.cutAfterBytes : Infinity;
    client.on("data", (buf: Buffer) => {
      const room = limit - sent;
      if (room <= 0) return;
      if (buf.length < room) {
        sent += buf.length;
        upstream.write(buf);
        return;
      }
      sent = limit;
      cut++;
      upstream.write(buf.subarray(0, room), kill);
    });
    upstream.on("data", (buf: Buffer) => client.write(buf));
    for (const s of [client, upstream]) {
      s.on("error", () => {});
      s.on("close", () => {
        sockets.delete(s);
        kill();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${addr.port}`,
    port: addr.port,
    cuts: () => cut,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
