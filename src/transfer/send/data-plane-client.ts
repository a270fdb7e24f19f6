import type { Socket } from "bun";
import {
  type AckBody,
  chunkHeadBytes,
  decodeReply,
  encodeChunkHead,
  encodeEnd,
  encodeOwner,
  encodeRunHead,
  encodeTrace,
  FRAME_HEAD,
  frameBytes,
  type KvAckLike,
  type KvChunkLike,
  MAX_HANDLE_BYTES,
  MAX_OWNER_BYTES,
  MAX_RUN,
  MAX_TRACE_BYTES,
  Reassembler,
  RUN_ENTRY,
  runFrameBytes,
  TransferError,
} from "../wire/index.ts";
import type { PushOptions } from "./kv-transport.ts";
import { Code } from "../../rpc/status.ts";
import { bunDial, type BunDial } from "../../rpc/bun-tls.ts";
import { DECODE_TARGET_ROLES } from "../../rpc/peer-policy.ts";
import type { TlsSource } from "../../rpc/tls-config.ts";
import { PoolChunk } from "./build-chunks.ts";

const encoder = new TextEncoder();
// D answers a push with one small frame: ACK, or ERROR with its message.
const MAX_REPLY_BYTES = 64 * 1024;
// Frames are staged and written in runs of this size: fewer syscalls, one copy.
const STAGE_BYTES = 1024 * 1024;
// Payloads adjacent in P's pool go to the socket straight from the pool from this many
// bytes on; shorter stretches are copied into the stage, which costs less than a write.
const DIRECT_BYTES = 256 * 1024;

interface Waiter {
  resolve(): void;
  reject(e: TransferError): void;
}

/** One TCP connection to a data plane and the push it is carrying. */
class Conn {
  socket!: Socket<Conn>;
  /** replies (ACK, ERROR: small) split across reads */
  private readonly rx = new Reassembler(256, MAX_REPLY_BYTES);
  private replyWaiter: { resolve(ack: Uint8Array): void; reject(e: TransferError): void } | undefined;
  private drainWaiter: Waiter | undefined;
  /** set once the connection is unusable */
  dead: TransferError | undefined;
  /** an ERROR or ACK that arrived while we were still writing */
  early: Uint8Array | undefined;

  constructor(readonly address: string) {}

  onData(buf: Uint8Array): void {
    const r = this.rx;
    for (let off = 0; off < buf.length; ) {
      const len = r.head(buf, off, 4, frameBytes);
      off += r.consumed;
      if (len < 0) return;
      if (len > MAX_REPLY_BYTES) {
        this.onClose(new Error(`reply frame of ${len} bytes, limit ${MAX_REPLY_BYTES}`));
        this.socket.terminate();
        return;
      }
      const f = r.take(buf, off, len);
      off += r.consumed;
      if (f === null) return;
      this.deliver(f.slice());
    }
  }

  private deliver(frame: Uint8Array): void {
    if (this.replyWaiter !== undefined) {
      const w = this.replyWaiter;
      this.replyWaiter = undefined;
      w.resolve(frame);
    } else {
      this.early = frame;
    }
    // A reply while we write (an ERROR mid-push) must stop the writer.
    this.drainWaiter?.resolve();
    this.drainWaiter = undefined;
  }

  onDrain(): void {
    const w = this.drainWaiter;
    this.drainWaiter = undefined;
    w?.resolve();
  }

  onClose(err?: Error): void {
    this.dead ??= new TransferError(Code.Unavailable, `data plane ${this.address}: connection ${err ? `failed: ${err.message}` : "closed"}`);
    this.drainWaiter?.reject(this.dead);
    this.drainWaiter = undefined;
    // An ERROR frame that arrived before the close still decides the outcome.
    if (this.replyWaiter !== undefined && this.early === undefined) this.replyWaiter.reject(this.dead);
    this.replyWaiter = undefined;
  }

  /** Writes all of `b`, waiting for drains; stops early (returns false) once a reply arrived. */
  async writeAll(b: Uint8Array): Promise<boolean> {
    let off = 0;
    while (off < b.length) {
      if (this.early !== undefined) return false;
      if (this.dead) throw this.dead;
      const w = this.socket.write(b.subarray(off));
      if (w < 0) throw (this.dead ??= new TransferError(Code.Unavailable, `data plane ${this.address}: connection closed`));
      off += w;
      if (off < b.length) {
        await new Promise<void>((resolve, reject) => {
          this.drainWaiter = { resolve, reject };
        });
      }
    }
    return true;
  }

  reply(): Promise<Uint8Array> {
    if (this.early !== undefined) {
      const f = this.early;
      this.early = undefined;
      return Promise.resolve(f);
    }
    if (this.dead) return Promise.reject(this.dead);
    return new Promise((resolve, reject) => {
      this.replyWaiter = { resolve, reject };
    });
  }
}

function splitHostPort(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(":");
  if (i < 0) throw new Error(`address ${address} is not host:port`);
  return { host: address.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(address.slice(i + 1)) };
}

export interface DataPlaneClientOptions {
  /** Deadline of one push; default 30 000 ms. */
  timeoutMs?: number;
  /** Mutual TLS: connect only to servers whose certificate names a decode (or both) engine. */
  tls?: TlsSource;
}

/**
 * The prefill side of the binary data plane (data-plane-frame.ts). Idle connections
 * are kept per address and reused; a connection that saw an error is dropped.
 */
export class DataPlaneClient {
  private readonly idle = new Map<string, Conn[]>();
  private readonly open = new Set<Conn>();
  private readonly timeoutMs: number;
  private stage = new Uint8Array(STAGE_BYTES);

  private readonly tls: TlsSource | undefined;

  constructor(opts: DataPlaneClientOptions = {}) {
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.tls = opts.tls;
  }

  private async connect(address: string): Promise<Conn> {
    const list = this.idle.get(address);
    while (list !== undefined && list.length > 0) {
      const c = list.pop()!;
      if (c.dead === undefined) {
        c.socket.ref();
        return c;
      }
    }
    const { host, port } = splitHostPort(address);
    const conn = new Conn(address);
    // Bun.connect resolves before the TLS handshake and drops writes made before it:
    // wait for the handshake, and for the server's certificate to name a decode engine.
    const dial = this.tls === undefined ? undefined : bunDial(this.tls, `data plane ${address}`, DECODE_TARGET_ROLES);
    try {
      conn.socket = await Bun.connect<Conn>({
        hostname: host,
        port,
        data: conn,
        ...(dial !== undefined ? { tls: dial.tls } : {}),
        socket: {
          handshake: (s, ok, err) => dial?.onHandshake(s, ok, err),
          data: (s, buf) => s.data.onData(buf),
          drain: (s) => s.data.onDrain(),
          close: (s, err) => {
            // A server that hangs up mid-handshake (it refused our certificate): say so now.
            dial?.onHandshake(s, false, err ?? new Error("connection closed during the handshake"));
            s.data.onClose(err);
            this.open.delete(s.data);
          },
          error: (s, err) => s.data.onClose(err),
          connectError: (s, err) => s.data.onClose(err),
        },
      });
    } catch (e) {
      throw new TransferError(Code.Unavailable, `data plane ${address}: ${e instanceof Error ? e.message : String(e)}`);
    }
    if (dial !== undefined) await this.verified(conn, dial);
    conn.socket.setNoDelay(true);
    this.open.add(conn);
    return conn;
  }

  /** Waits (up to the push deadline) for the handshake's verdict; a refused server is hung up on. */
  private async verified(conn: Conn, dial: BunDial): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no TLS handshake within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    try {
      await Promise.race([dial.verified, late]);
    } catch (e) {
      conn.socket.terminate();
      const refusedRole = e instanceof Error && / is [a-z]+\/.*, not one of /.test(e.message);
      throw new TransferError(refusedRole ? Code.PermissionDenied : Code.Unavailable, e instanceof Error ? e.message : String(e));
    } finally {
      clearTimeout(timer);
    }
  }

  async push(address: string, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts: PushOptions = {}): Promise<KvAckLike> {
    if (opts.signal?.aborted) throw new TransferError(Code.Canceled, `data plane push to ${address}: cancelled`);
    const conn = await this.connect(address);
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    // Hanging up mid-push is how P abandons it: D frees what the push took.
    const stopped = new Promise<never>((_, reject) => {
      const stop = (e: TransferError) => {
        conn.dead ??= e;
        reject(conn.dead);
        conn.socket.terminate();
      };
      timer = setTimeout(
        () => stop(new TransferError(Code.DeadlineExceeded, `data plane push to ${address}: no answer within ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
      if (opts.signal) {
        onAbort = () => stop(new TransferError(Code.Canceled, `data plane push to ${address}: cancelled`));
        opts.signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    stopped.catch(() => {});
    let handleId = "";
    let ok = false;
    try {
      const ack = await Promise.race([
        this.run(
          conn,
          chunks,
          (h) => {
            handleId = h;
          },
          opts.traceparent,
          opts.owner,
        ),
        stopped,
      ]);
      ok = true;
      return { ...ack, handleId };
    } finally {
      clearTimeout(timer);
      if (onAbort) opts.signal!.removeEventListener("abort", onAbort);
      if (ok && conn.dead === undefined) {
        conn.socket.unref();
        let list = this.idle.get(address);
        if (list === undefined) this.idle.set(address, (list = []));
        list.push(conn);
      } else {
        // A refused or broken push: the server discards this connection's input, so hang up.
        conn.dead ??= new TransferError(Code.Aborted, "push abandoned");
        conn.socket.terminate();
      }
    }
  }

  private async run(
    conn: Conn,
    chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>,
    onHandle: (h: string) => void,
    traceparent?: string,
    owner?: string,
  ): Promise<AckBody> {
    // Pushes on different connections may interleave at awaits: each run stages in
    // its own buffer when the shared one is taken.
    const stage = this.stage.length > 0 ? this.stage : new Uint8Array(STAGE_BYTES);
    this.stage = new Uint8Array(0);
    try {
      const w = new PushWriter(conn, stage, onHandle);
      if (traceparent !== undefined) w.trace(traceparent);
      if (owner) w.owner(owner);
      if (Array.isArray(chunks)) await w.writeList(chunks as readonly KvChunkLike[]);
      else await w.writeStream(chunks as AsyncIterable<KvChunkLike>);
      await w.end();
    } finally {
      this.stage = stage;
    }
    const r = decodeReply(await conn.reply());
    if (r.kind === "ack") return r.ack;
    if (r.kind === "error") throw (conn.dead = new TransferError(r.code, `data plane ${conn.address}: ${r.message}`));
    throw (conn.dead = new TransferError(Code.Internal, `data plane ${conn.address}: unexpected reply type ${r.type}`));
  }

  async close(): Promise<void> {
    for (const c of this.open) c.socket.terminate();
    this.open.clear();
    this.idle.clear();
  }
}

/**
 * Frames one push into a stage buffer and writes it to the connection in runs of
 * STAGE_BYTES: fewer syscalls, one copy. A block still in P's pool is written straight
 * into the stage (CHUNK) or handed to the socket as it lies there (RUN payloads of
 * adjacent blocks). `stopped` turns true once D answered mid-push (an ERROR): the
 * writer then writes nothing more.
 */
class PushWriter {
  private used = 0;
  private handle = "";
  private hb = new Uint8Array(0);
  stopped = false;

  constructor(
    private readonly conn: Conn,
    private readonly stage: Uint8Array,
    private readonly onHandle: (h: string) => void,
  ) {}

  /** A TRACE frame first: names the parent of D's span for this push. Too long a traceparent is left out. */
  trace(traceparent: string): void {
    if (traceparent.length <= MAX_TRACE_BYTES) this.used = encodeTrace(this.stage, this.used, encoder.encode(traceparent));
  }

  /** An OWNER frame before the first chunk: D binds the handle to that gateway replica. */
  owner(owner: string): void {
    const b = encoder.encode(owner);
    if (b.length <= MAX_OWNER_BYTES) this.used = encodeOwner(this.stage, this.used, b);
  }

  /** A list known whole: full blocks still in the pool go as RUN frames, the rest as CHUNKs. */
  async writeList(list: readonly KvChunkLike[]): Promise<void> {
    for (let i = 0; i < list.length && !this.stopped; ) {
      if (this.runnable(list, i, i)) {
        this.headOf(list[i]!);
        let j = i + 1;
        while (j < list.length && this.runnable(list, j, i)) j++;
        await this.sendRun(list as readonly PoolChunk[], i, j);
        i = j;
        continue;
      }
      const c = list[i++]!;
      if (!this.tryPut(c)) await this.frame(c);
    }
  }

  /** A producer may be slow (chunks as layers finish): each chunk goes out as it comes. */
  async writeStream(chunks: AsyncIterable<KvChunkLike>): Promise<void> {
    for await (const c of chunks) {
      await this.frame(c);
      if (!this.stopped) await this.flush();
      if (this.stopped) break;
    }
  }

  /** The END frame, unless D already answered. */
  async end(): Promise<void> {
    if (this.stopped) return;
    if (this.used + FRAME_HEAD > this.stage.length) await this.flush();
    this.used = encodeEnd(this.stage, this.used);
    await this.flush();
  }

  private async flush(): Promise<void> {
    if (this.used > 0 && !(await this.conn.writeAll(this.stage.subarray(0, this.used)))) this.stopped = true;
    this.used = 0;
  }

  /** Bytes of a CHUNK frame's head for `c`; a new handle is encoded once. */
  private headOf(c: KvChunkLike): number {
    if (c.handleId !== this.handle) {
      this.handle = c.handleId;
      this.hb = encoder.encode(this.handle);
      if (this.hb.length > MAX_HANDLE_BYTES) throw new TransferError(Code.InvalidArgument, `handle of ${this.hb.length} bytes`);
      this.onHandle(this.handle);
    }
    return chunkHeadBytes(this.hb.length);
  }

  /**
   * Frames `c` into the stage if it fits: no await, so a run of chunks costs no
   * promise each. A block still in P's pool is written straight into the stage,
   * envelope and CRCs: its one copy on this side.
   */
  private tryPut(c: KvChunkLike): boolean {
    const head = this.headOf(c);
    const direct = c instanceof PoolChunk && c.fromPool;
    const bytes = direct ? c.envelopeBytes : c.envelope.length;
    const o = this.used;
    if (o + head + bytes > this.stage.length) return false;
    const e = o + head;
    if (direct) {
      encodeChunkHead(this.stage, o, c, c.writeEnvelope(this.stage, e), this.hb, bytes);
    } else {
      encodeChunkHead(this.stage, o, c, c.crc32c, this.hb, bytes);
      this.stage.set(c.envelope, e);
    }
    this.used = e + bytes;
    return true;
  }

  /** `c` after a flush; an envelope bigger than the stage goes straight to the socket after its head. */
  private async frame(c: KvChunkLike): Promise<void> {
    if (this.tryPut(c)) return;
    await this.flush();
    if (this.stopped || this.tryPut(c)) return;
    const env = c.envelope;
    this.used = encodeChunkHead(this.stage, 0, c, c.crc32c, this.hb, env.length);
    await this.flush();
    if (!this.stopped && !(await this.conn.writeAll(env))) this.stopped = true;
  }

  /** Whether chunk k can join a RUN after chunk k-1 (or start one at `start`). */
  private runnable(list: readonly KvChunkLike[], k: number, start: number): boolean {
    const c = list[k]!;
    if (!(c instanceof PoolChunk && c.whole)) return false;
    if (k === start) return true;
    const s0 = list[start] as PoolChunk;
    return k - start < MAX_RUN && c.pool === s0.pool && c.handleId === s0.handleId && c.total === s0.total && c.index === list[k - 1]!.index + 1;
  }

  /**
   * Chunks [i, j) as one RUN frame: their entries in the stage, then their payloads,
   * each stretch of blocks adjacent in the pool written from the pool itself.
   */
  private async sendRun(list: readonly PoolChunk[], i: number, j: number): Promise<void> {
    const first = list[i]!;
    const P = first.pool.blockBytes;
    if (this.used + runFrameBytes(this.hb.length, j - i) > this.stage.length) await this.flush();
    if (this.stopped) return;
    let o = encodeRunHead(this.stage, this.used, { first: first.index, count: j - i, total: first.total, kvFormat: first.kvFormat, payloadBytes: P }, this.hb);
    for (let k = i; k < j; k++, o += RUN_ENTRY) list[k]!.writeRunEntry(this.stage, o);
    this.used = o;
    for (let k = i; k < j && !this.stopped; ) {
      let q = k + 1;
      while (q < j && list[q]!.blockId === list[q - 1]!.blockId + 1) q++;
      await this.sendPayloads(list, k, q);
      k = q;
    }
  }

  /**
   * The payloads of chunks [k, q), adjacent in the pool: from the pool itself when long enough
   * (a pool split by layer: each block's segments in layer order), else through the stage.
   */
  private async sendPayloads(list: readonly PoolChunk[], k: number, q: number): Promise<void> {
    const pool = list[k]!.pool;
    const P = pool.blockBytes;
    const first = list[k]!.blockId;
    const bytes = (q - k) * P;
    if (bytes >= DIRECT_BYTES) {
      await this.flush();
      const segs = pool.segments;
      if (segs.length === 1) {
        if (!this.stopped && !(await this.conn.writeAll(segs[0]!.bytes.subarray(first * P, first * P + bytes)))) this.stopped = true;
        return;
      }
      for (let id = first; id < first + q - k; id++) {
        for (const g of segs) {
          if (this.stopped) return;
          if (!(await this.conn.writeAll(g.bytes.subarray(id * g.blockBytes, (id + 1) * g.blockBytes)))) this.stopped = true;
        }
      }
      return;
    }
    for (let m = k; m < q && !this.stopped; m++) {
      if (this.used + P > this.stage.length) await this.flush();
      this.stage.set(pool.payload(list[m]!.blockId), this.used);
      this.used += P;
    }
  }
}
