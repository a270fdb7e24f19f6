import type { Socket, SocketHandler, TCPSocketListener } from "bun";
import { envelopeBytes, KV_FORMAT, type KvShape } from "../../codec/index.ts";
import { tracingEnabled } from "../../obs/index.ts";
import {
  CHUNK_FIXED,
  decodeChunk,
  decodeOwner,
  decodeRun,
  decodeTrace,
  encodeAck,
  encodeError,
  FRAME_CHUNK,
  FRAME_END,
  FRAME_HEAD,
  FRAME_OWNER,
  FRAME_RUN,
  FRAME_TRACE,
  frameBytes,
  type KvChunkLike,
  KvError,
  MAX_RUN,
  Reassembler,
  RUN_ENTRY,
  RUN_ENTRY_HEAD,
  RUN_FIXED,
  runEntryCrc,
  runEntryHash,
  runEntryTrailer,
  type RunHead,
} from "../wire/index.ts";
import { Code } from "../../rpc/status.ts";
import type { KvReceiver } from "./kv-receiver.ts";
import { DATA_PLANE_PUSH_ATTRS, PushDriver } from "./push-driver.ts";
import { admitBunPeer, bunServerTls } from "../../rpc/bun-tls.ts";
import { DATA_PLANE_PUSH } from "../../rpc/peer-policy.ts";
import { peerIdentity, peerKey } from "../../rpc/peer-identity.ts";
import type { TlsSource } from "../../rpc/tls-config.ts";

export interface DataPlaneServerOptions {
  host?: string;
  port?: number;
  /** Mutual TLS: only prefill (or both) certificates of the cluster may connect. */
  tls?: TlsSource | null;
  /** Most concurrent connections of admitted peers; default 256. */
  maxConnections?: number;
  /** A connection silent this long is cut (a push on it freed); default 30 000 ms. */
  idleTimeoutMs?: number;
  /** mTLS: a connection has this long to finish its handshake; default 5 000 ms. */
  handshakeTimeoutMs?: number;
  /**
   * mTLS: connections not yet through the handshake, at most; default 64. Apart from
   * maxConnections, so strangers never take an admitted peer's room; when it is full the
   * oldest is cut for the newest, so a flood of idle sockets cannot hold it against a peer
   * whose handshake takes milliseconds.
   */
  maxUnauthenticated?: number;
}

export interface DataPlaneServer {
  /** host:port, as advertised in HasBlocksResponse.data_plane_address */
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

const decoder = new TextDecoder();

/** Per-connection state: a frame being reassembled and the push it belongs to. */
class Conn {
  /** frames split across reads */
  readonly frames: Reassembler;
  /** the push on this connection, one at a time */
  readonly push: PushDriver;
  /** after an ERROR: input is discarded until the client hangs up */
  refused = false;
  /** plaintext, or an mTLS peer whose certificate may push */
  admitted = false;
  /** one reused chunk object: the receiver copies what it keeps */
  readonly chunk: KvChunkLike = { handleId: "", index: 0, total: 0, hash: 0n, kvFormat: KV_FORMAT, envelope: new Uint8Array(0), crc32c: 0 };
  handleBytes = new Uint8Array(0);
  /** one reused RUN head */
  readonly runHead: RunHead = { first: 0, count: 0, total: 0, kvFormat: 0, payloadBytes: 0, entries: new Uint8Array(0) };
  /** bytes of replies the socket did not take yet */
  out: Uint8Array[] = [];
  /** The RUN frame whose payloads are arriving: its entries (a copy), the next one, and how many payloads are still due. */
  run = new Uint8Array(0);
  runNext = 0;
  runLeft = 0;
  /** the RUN's payloads, P bytes of the pool's shape each */
  readonly payloads: Reassembler;
  readonly shape: KvShape;

  constructor(
    rx: KvReceiver,
    /** the largest CHUNK and RUN frames (their lengths, the payloads after a RUN apart) */
    readonly maxChunk: number,
    readonly maxRun: number,
    readonly payloadBytes: number,
  ) {
    const max = Math.max(maxChunk, maxRun);
    this.frames = new Reassembler(Math.min(max, 64 * 1024), max);
    this.payloads = new Reassembler(payloadBytes);
    this.push = new PushDriver(rx);
    this.shape = rx.pool.shape;
  }
}

/**
 * The binary data plane: PushKv's chunk semantics over a raw TCP connection (Bun
 * sockets), driving the same KvReceiver as the gRPC service so CRC checks, refusal
 * codes and freeing are identical. A connection carries any number of pushes, one at
 * a time; a push is accepted only on an END frame after all `total` chunks, and a
 * connection that closes mid-push frees everything the push took.
 */
export async function serveDataPlane(receiver: KvReceiver, opts: DataPlaneServerOptions = {}): Promise<DataPlaneServer> {
  const host = opts.host ?? "127.0.0.1";
  const tls = opts.tls ?? null;
  const maxConnections = opts.maxConnections ?? 256;
  const idleS = Math.max(1, Math.ceil((opts.idleTimeoutMs ?? 30_000) / 1000));
  // The largest legal frames: a full envelope plus the chunk head and a maximal handle;
  // a RUN's head, handle and entries (its payloads follow the frame, one block at a time).
  const maxChunk = FRAME_HEAD + CHUNK_FIXED + 0xffff + envelopeBytes(receiver.pool.shape, 1);
  const maxRun = FRAME_HEAD + RUN_FIXED + 0xffff + MAX_RUN * RUN_ENTRY;
  const sockets = new Set<Socket<Conn>>();
  const pending = new Set<Socket<Conn>>();
  const handshakeS = Math.max(1, Math.ceil((opts.handshakeTimeoutMs ?? 5_000) / 1000));
  const maxPending = opts.maxUnauthenticated ?? 64;
  const handlers = connHandlers(receiver, sockets, pending, { tls, maxConnections, idleS, handshakeS, maxPending, maxChunk, maxRun });
  const listen = (port: number): TCPSocketListener<Conn> =>
    Bun.listen<Conn>({ hostname: host, port, ...(tls !== null ? { tls: bunServerTls(tls) } : {}), socket: handlers });
  let listener = listen(opts.port ?? 0);
  // Bun's listener.reload() keeps its first certificate: on rotation, listen afresh on the
  // same port (open connections stay on the old one until they end).
  const stopFollowing =
    tls?.onChange(() => {
      const port = listener.port;
      listener.stop(false);
      listener = listen(port);
    }) ?? (() => {});
  const address = `${host.includes(":") ? `[${host}]` : host}:${listener.port}`;
  return {
    address,
    port: listener.port,
    async close() {
      stopFollowing();
      listener.stop(true);
      for (const s of pending) s.terminate();
      pending.clear();
      for (const s of sockets) {
        s.data.push.fail(new KvError(Code.Unavailable, "data plane closed"));
        s.terminate();
      }
      sockets.clear();
    },
  };
}

interface ConnLimits {
  tls: TlsSource | null;
  maxConnections: number;
  idleS: number;
  handshakeS: number;
  maxPending: number;
  maxChunk: number;
  maxRun: number;
}

/**
 * A connection's life. With mTLS it is first unauthenticated (in `pending`: its own small
 * budget, the oldest cut for a newcomer when full, and a short handshake deadline), and gets a
 * Conn (its buffers) and a place among `sockets` (the cap, the idle timeout) only once its
 * certificate may push. Plaintext connections are admitted at once.
 */
function connHandlers(receiver: KvReceiver, sockets: Set<Socket<Conn>>, pending: Set<Socket<Conn>>, lim: ConnLimits): SocketHandler<Conn> {
  const { tls, maxConnections, idleS, handshakeS, maxPending, maxChunk, maxRun } = lim;
  const admit = (s: Socket<Conn>): boolean => {
    // Beyond the cap a connection is cut before it costs a buffer.
    if (sockets.size >= maxConnections) {
      s.terminate();
      return false;
    }
    s.data = new Conn(receiver, maxChunk, maxRun, receiver.pool.blockBytes);
    s.data.admitted = true;
    sockets.add(s);
    // Idle (no byte either way) this long: cut, and a push in progress is freed.
    s.timeout(idleS);
    return true;
  };
  return {
    open(s) {
      if (tls === null) return void admit(s);
      if (pending.size >= maxPending) {
        const oldest = pending.values().next().value!;
        pending.delete(oldest);
        oldest.terminate();
      }
      pending.add(s);
      s.timeout(handshakeS);
    },
    handshake(s) {
      if (!pending.delete(s)) return;
      const why = admitBunPeer(s, DATA_PLANE_PUSH);
      if (why !== null) return void s.end();
      if (!admit(s)) return;
      const id = peerIdentity(s);
      s.data.push.peer = id === null ? "" : peerKey(id);
    },
    timeout(s) {
      s.terminate();
    },
    data(s, buf) {
      if (s.data?.admitted) onData(s, buf);
      release(buf);
    },
    drain(s) {
      flush(s);
    },
    close(s) {
      pending.delete(s);
      if (s.data === undefined) return;
      sockets.delete(s);
      s.data.push.fail(new KvError(Code.Canceled, "connection closed mid-push"));
    },
    error(s) {
      if (s.data === undefined) return;
      s.data.push.fail(new KvError(Code.Canceled, "connection failed mid-push"));
    },
  };
}

function onData(s: Socket<Conn>, buf: Uint8Array): void {
  const c = s.data;
  let off = 0;
  while (off < buf.length && !c.refused) {
    if (c.runLeft > 0) {
      // A RUN's payloads: each checked and imported where it lies in the read, or
      // collected first when the read splits it.
      const payload = c.payloads.take(buf, off, c.payloadBytes);
      off += c.payloads.consumed;
      if (payload === null) return;
      onRunPayload(s, payload);
      continue;
    }
    const r = c.frames;
    const len = r.head(buf, off, FRAME_HEAD, frameBytes);
    off += r.consumed;
    if (len < 0 || !checkLen(s, len, r.headBuf[r.headAt + 4]!)) return;
    const f = r.take(buf, off, len);
    off += r.consumed;
    if (f === null) return;
    onFrame(s, f);
  }
}

/**
 * Frees a read buffer now instead of at the next garbage collection. Bun hands every
 * read over in a fresh ArrayBuffer (up to 512 KB); in a decode engine the pool makes the
 * heap large, so collections are rare and each push's reads land on fresh pages, which
 * fault in one by one (thousands of faults per 32 MB push).
 * Detached, the memory goes straight back to the allocator and the next read reuses it,
 * still mapped and in cache. Safe because nothing keeps a view of `buf` past onData: a
 * frame split across reads is copied into `acc`, and the receiver copies what it keeps
 * (importBlock). A buffer that is a view of a larger one is left alone.
 */
function release(buf: Uint8Array): void {
  const ab = buf.buffer;
  if (ab instanceof ArrayBuffer && buf.byteOffset === 0 && buf.byteLength === ab.byteLength && !ab.detached) ab.transfer(0);
}

function checkLen(s: Socket<Conn>, len: number, type: number): boolean {
  const max = type === FRAME_RUN ? s.data.maxRun : s.data.maxChunk;
  if (len >= FRAME_HEAD && len <= max) return true;
  // Over the limit is refused as gRPC refuses an oversized message (readMaxBytes), before any of it is buffered.
  const code = len < FRAME_HEAD ? Code.InvalidArgument : Code.ResourceExhausted;
  refuse(s, new KvError(code, `data plane frame of ${len} bytes, ${len < FRAME_HEAD ? `need ≥ ${FRAME_HEAD}` : `limit ${max}`}`));
  return false;
}

function onFrame(s: Socket<Conn>, f: Uint8Array): void {
  const c = s.data;
  try {
    const type = f[4]!;
    if (type === FRAME_CHUNK) {
      setHandle(c, decodeChunk(f, c.chunk));
      c.push.accept(c.chunk);
    } else if (type === FRAME_RUN) {
      beginRun(c, f);
    } else if (type === FRAME_END) {
      send(s, encodeAck(c.push.finish()));
    } else if (type === FRAME_OWNER) {
      const owner = decodeOwner(f);
      if (c.push.open) throw new KvError(Code.InvalidArgument, "owner frame inside a push");
      c.push.owner = owner;
    } else if (type === FRAME_TRACE) {
      const traceparent = decodeTrace(f);
      if (tracingEnabled()) c.push.trace(traceparent, DATA_PLANE_PUSH_ATTRS);
    } else {
      throw new KvError(Code.InvalidArgument, `unknown data plane frame type ${type}`);
    }
  } catch (e) {
    refuse(s, e);
  }
}

function setHandle(c: Conn, hb: Uint8Array): void {
  if (!sameBytes(hb, c.handleBytes)) {
    c.chunk.handleId = decoder.decode(hb);
    c.handleBytes = hb.slice();
  }
}

/** Checks a RUN frame and keeps its entries; the payloads that follow are onRunPayload's. */
function beginRun(c: Conn, f: Uint8Array): void {
  const run = c.runHead;
  const handle = decodeRun(f, run);
  const { count, payloadBytes } = run;
  // Another payload size is another block shape: refused as reader rule 7 refuses it.
  if (payloadBytes !== c.payloadBytes) {
    const shape = c.shape;
    throw new KvError(
      Code.FailedPrecondition,
      `run of ${payloadBytes}-byte payloads, pool blocks (B=${shape.blockTokens} L=${shape.nLayers} H=${shape.nKvHeads} D=${shape.headDim}) are ${c.payloadBytes} bytes`,
    );
  }
  const ch = c.chunk;
  setHandle(c, handle);
  ch.index = run.first;
  ch.total = run.total;
  ch.kvFormat = run.kvFormat;
  // The read buffer goes back to the allocator after this read: the entries are kept.
  const bytes = count * RUN_ENTRY;
  if (c.run.length < bytes) c.run = new Uint8Array(Math.max(bytes, Math.min(MAX_RUN * RUN_ENTRY, c.run.length * 2)));
  c.run.set(run.entries, 0);
  c.push.begin(ch.handleId, ch.total);
  c.runNext = 0;
  c.runLeft = count;
  c.payloads.reset();
}

function onRunPayload(s: Socket<Conn>, payload: Uint8Array): void {
  const c = s.data;
  try {
    const e = c.runNext * RUN_ENTRY;
    const ch = c.chunk;
    ch.hash = runEntryHash(c.run, e);
    ch.crc32c = runEntryCrc(c.run, e);
    c.push.acceptParts(ch, c.run, e + RUN_ENTRY_HEAD, payload, runEntryTrailer(c.run, e));
    ch.index++;
    c.runNext++;
    c.runLeft--;
  } catch (err) {
    refuse(s, err);
  }
}

/** Frees the push, answers ERROR, and ignores the connection's input from here on. */
function refuse(s: Socket<Conn>, e: unknown): void {
  const err = s.data.push.fail(e);
  s.data.refused = true;
  send(s, encodeError(err.code, err.rawMessage));
  // The client hangs up on ERROR; one that does not is cut loose after a while.
  setTimeout(() => s.end(), 5_000).unref();
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
