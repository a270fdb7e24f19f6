import type { Socket, TCPSocketListener } from "bun";
import { envelopeBytes } from "../codec/index.ts";
import { endSpan, SpanKind, startSpan, tracingEnabled, type Attributes, type Span } from "../obs/index.ts";
import { KV_FORMAT, type KvChunkLike } from "./kv-chunk.ts";
import { GrpcCode, KvError } from "./kv-error.ts";
import type { KvReceiver, PushSession } from "./kv-receiver.ts";
import {
  ACK_BODY,
  CHUNK_FIXED,
  FRAME_ACK,
  FRAME_CHUNK,
  FRAME_END,
  FRAME_ERROR,
  FRAME_HEAD,
  FRAME_TRACE,
  getU32,
  getU64,
  MAX_TRACE_BYTES,
  putU32,
  putU64,
} from "./data-plane-frame.ts";

export interface DataPlaneServer {
  /** host:port, as advertised in HasBlocksResponse.data_plane_address */
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** Per-connection state: a frame being reassembled and the push it belongs to. */
class Conn {
  /** reassembly buffer for a frame split across reads */
  acc: Uint8Array;
  have = 0;
  session: PushSession | undefined;
  /** after an ERROR: input is discarded until the client hangs up */
  refused = false;
  /** one reused chunk object: the receiver copies what it keeps */
  readonly chunk: KvChunkLike = { handleId: "", index: 0, total: 0, hash: 0n, kvFormat: KV_FORMAT, envelope: new Uint8Array(0), crc32c: 0 };
  handleBytes = new Uint8Array(0);
  /** bytes of replies the socket did not take yet */
  out: Uint8Array[] = [];
  /** kv.transfer SERVER span of the push in progress, when P sent a TRACE frame */
  span: Span | undefined;

  constructor(readonly maxFrame: number) {
    this.acc = new Uint8Array(Math.min(maxFrame, 64 * 1024));
  }
}

/**
 * The binary data plane: PushKv's chunk semantics over a raw TCP connection (Bun
 * sockets), driving the same KvReceiver as the gRPC service so CRC checks, refusal
 * codes and freeing are identical. A connection carries any number of pushes, one at
 * a time; a push is accepted only on an END frame after all `total` chunks, and a
 * connection that closes mid-push frees everything the push took.
 */
export async function serveDataPlane(receiver: KvReceiver, opts: { host?: string; port?: number } = {}): Promise<DataPlaneServer> {
  const host = opts.host ?? "127.0.0.1";
  // The largest legal frame: a full envelope plus the chunk head and a maximal handle.
  const maxFrame = FRAME_HEAD + CHUNK_FIXED + 0xffff + envelopeBytes(receiver.pool.shape, 1);
  const sockets = new Set<Socket<Conn>>();
  const listener: TCPSocketListener<Conn> = Bun.listen<Conn>({
    hostname: host,
    port: opts.port ?? 0,
    socket: {
      open(s) {
        s.data = new Conn(maxFrame);
        sockets.add(s);
      },
      data(s, buf) {
        onData(receiver, s, buf);
        release(buf);
      },
      drain(s) {
        flush(s);
      },
      close(s) {
        sockets.delete(s);
        s.data.session?.abort();
        s.data.session = undefined;
        endTrace(s.data, "connection closed mid-push");
      },
      error(s) {
        s.data.session?.abort();
        s.data.session = undefined;
        endTrace(s.data, "connection failed mid-push");
      },
    },
  });
  const address = `${host.includes(":") ? `[${host}]` : host}:${listener.port}`;
  return {
    address,
    port: listener.port,
    async close() {
      listener.stop(true);
      for (const s of sockets) {
        s.data.session?.abort();
        s.terminate();
      }
      sockets.clear();
    },
  };
}

function onData(rx: KvReceiver, s: Socket<Conn>, buf: Uint8Array): void {
  const c = s.data;
  if (c.refused) return;
  let off = 0;
  const n = buf.length;
  while (off < n && !c.refused) {
    if (c.have > 0 || n - off < 4) {
      // Continue (or start) a frame split across reads: collect it in `acc`.
      if (c.have < 4) {
        const k = Math.min(4 - c.have, n - off);
        c.acc.set(buf.subarray(off, off + k), c.have);
        c.have += k;
        off += k;
        if (c.have < 4) return;
      }
      const len = 4 + getU32(c.acc, 0);
      if (!checkLen(s, len)) return;
      if (c.acc.length < len) {
        const bigger = new Uint8Array(Math.min(c.maxFrame, Math.max(len, c.acc.length * 2)));
        bigger.set(c.acc.subarray(0, c.have));
        c.acc = bigger;
      }
      const k = Math.min(len - c.have, n - off);
      c.acc.set(buf.subarray(off, off + k), c.have);
      c.have += k;
      off += k;
      if (c.have < len) return;
      c.have = 0;
      onFrame(rx, s, c.acc.subarray(0, len));
      continue;
    }
    const len = 4 + getU32(buf, off);
    if (!checkLen(s, len)) return;
    if (n - off >= len) {
      // Whole frame in this read: no copy.
      onFrame(rx, s, buf.subarray(off, off + len));
      off += len;
    } else {
      if (c.acc.length < len) c.acc = new Uint8Array(len);
      c.acc.set(buf.subarray(off), 0);
      c.have = n - off;
      off = n;
    }
  }
}

/**
 * Frees a read buffer now instead of at the next garbage collection. Bun hands every
 * read over in a fresh ArrayBuffer (up to 512 KB); in a decode engine the pool makes the
 * heap large, so collections are rare and each push's reads land on fresh pages, which
 * fault in one by one (on the bench VM: ~1,000-3,600 faults, +12-45 ms, per 32 MB push).
 * Detached, the memory goes straight back to the allocator and the next read reuses it,
 * still mapped and in cache. Safe because nothing keeps a view of `buf` past onData: a
 * frame split across reads is copied into `acc`, and the receiver copies what it keeps
 * (importBlock). A buffer that is a view of a larger one is left alone.
 */
function release(buf: Uint8Array): void {
  const ab = buf.buffer;
  if (ab instanceof ArrayBuffer && buf.byteOffset === 0 && buf.byteLength === ab.byteLength && !ab.detached) ab.transfer(0);
}

function checkLen(s: Socket<Conn>, len: number): boolean {
  if (len >= FRAME_HEAD && len <= s.data.maxFrame) return true;
  // Over the limit is refused as gRPC refuses an oversized message (readMaxBytes), before any of it is buffered.
  const code = len < FRAME_HEAD ? GrpcCode.INVALID_ARGUMENT : GrpcCode.RESOURCE_EXHAUSTED;
  refuse(s, new KvError(code, `data plane frame of ${len} bytes, ${len < FRAME_HEAD ? `need ≥ ${FRAME_HEAD}` : `limit ${s.data.maxFrame}`}`));
  return false;
}

function onFrame(rx: KvReceiver, s: Socket<Conn>, f: Uint8Array): void {
  const c = s.data;
  try {
    const type = f[4]!;
    if (type === FRAME_CHUNK) {
      if (f.length < FRAME_HEAD + CHUNK_FIXED) throw new KvError(GrpcCode.INVALID_ARGUMENT, `chunk frame of ${f.length} bytes`);
      const o = FRAME_HEAD;
      const hl = f[o + 24]! | (f[o + 25]! << 8);
      const eo = o + CHUNK_FIXED + hl;
      if (eo > f.length) throw new KvError(GrpcCode.INVALID_ARGUMENT, `chunk frame of ${f.length} bytes, handle of ${hl}`);
      const ch = c.chunk;
      const hb = f.subarray(o + CHUNK_FIXED, eo);
      if (!sameBytes(hb, c.handleBytes)) {
        ch.handleId = decoder.decode(hb);
        c.handleBytes = hb.slice();
      }
      ch.index = getU32(f, o);
      ch.total = getU32(f, o + 4);
      ch.hash = getU64(f, o + 8);
      ch.kvFormat = getU32(f, o + 16);
      ch.crc32c = getU32(f, o + 20);
      ch.envelope = f.subarray(eo);
      c.session ??= rx.begin(ch.handleId, ch.total);
      c.session.accept(ch);
    } else if (type === FRAME_END) {
      if (c.session === undefined) throw new KvError(GrpcCode.INVALID_ARGUMENT, "empty push");
      const s0 = c.session;
      c.session = undefined;
      let ack;
      try {
        ack = s0.finish();
      } catch (e) {
        s0.abort();
        throw e;
      }
      const r = new Uint8Array(FRAME_HEAD + ACK_BODY);
      putU32(r, 0, r.length - 4);
      r[4] = FRAME_ACK;
      putU32(r, 5, ack.blocksReceived);
      putU32(r, 9, ack.blocksDeduped);
      putU64(r, 13, ack.payloadBytes);
      putU32(r, 21, ack.nTokens);
      send(s, r);
      if (c.span?.isRecording()) c.span.setAttributes({ "tl.kv.handle": s0.handleId, "tl.kv.blocks_sent": ack.blocksReceived, "tl.kv.blocks_deduped": ack.blocksDeduped, "tl.kv.payload_bytes": Number(ack.payloadBytes) });
      endTrace(c);
    } else if (type === FRAME_TRACE) {
      if (f.length - FRAME_HEAD > MAX_TRACE_BYTES) throw new KvError(GrpcCode.INVALID_ARGUMENT, `trace frame of ${f.length} bytes, limit ${FRAME_HEAD + MAX_TRACE_BYTES}`);
      endTrace(c, "a new push began before this one ended");
      if (tracingEnabled()) c.span = startSpan("kv.transfer", SpanKind.SERVER, decoder.decode(f.subarray(FRAME_HEAD)), TRACE_ATTRS);
    } else {
      throw new KvError(GrpcCode.INVALID_ARGUMENT, `unknown data plane frame type ${type}`);
    }
  } catch (e) {
    refuse(s, e instanceof KvError ? e : new KvError(GrpcCode.INTERNAL, e instanceof Error ? e.message : String(e)));
  }
}

/** Frees the push, answers ERROR, and ignores the connection's input from here on. */
function refuse(s: Socket<Conn>, e: KvError): void {
  const c = s.data;
  c.session?.abort();
  c.session = undefined;
  c.refused = true;
  endTrace(c, e);
  const msg = encoder.encode(e.message);
  const r = new Uint8Array(FRAME_HEAD + 4 + msg.length);
  putU32(r, 0, r.length - 4);
  r[4] = FRAME_ERROR;
  putU32(r, 5, e.code);
  r.set(msg, 9);
  send(s, r);
  // The client hangs up on ERROR; one that does not is cut loose after a while.
  setTimeout(() => s.end(), 5_000).unref();
}

const TRACE_ATTRS: Attributes = { "tl.role": "decode", "tl.kv.transport": "data-plane" };

function endTrace(c: Conn, error?: unknown): void {
  if (c.span === undefined) return;
  endSpan(c.span, error);
  c.span = undefined;
}

function send(s: Socket<Conn>, r: Uint8Array): void {
  s.data.out.push(r);
  flush(s);
}

function flush(s: Socket<Conn>): void {
  const q = s.data.out;
  while (q.length > 0) {
    const b = q[0]!;
    const w = s.write(b);
    if (w < 0) {
      q.length = 0;
      return;
    }
    if (w < b.length) {
      q[0] = b.subarray(w);
      return;
    }
    q.shift();
  }
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
