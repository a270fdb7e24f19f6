// PushKv as a gRPC client stream written by hand over a Connect HTTP/2 session.
//
// Connect's client copies each KvChunk three times before HTTP/2 sees it (protobuf
// writer with its growth, finish(), the gRPC length prefix) and waits for each write's
// callback before serializing the next message. Measured with bench/transfer.ts' shape
// (1,000 envelopes of 32 KiB), those copies were about half of the push's CPU time.
// Here each message is a small hand-encoded head (gRPC prefix and every field but the
// envelope) followed by the envelope, copied once into a 1 MiB stage. The wire is plain
// tl.kv.v1 gRPC: field 7 (crc32c) precedes field 6 (envelope) so the envelope ends the
// message; protobuf parsers accept fields in any order.
import * as http2 from "node:http2";
import { fromBinary } from "@bufbuild/protobuf";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { KvAckSchema } from "../../gen/tl/kv/v1/kv_pb.ts";
import { type KvAckLike, type KvChunkLike, TransferError } from "../wire/index.ts";
import { GRPC_PREFIX_BYTES, grpcMessageLength, grpcStatusOf, putGrpcPrefix } from "../../rpc/grpc-wire.ts";
import { Code, codeOfHttpStatus } from "../../rpc/status.ts";
import { putU32, putU64 } from "../../codec/index.ts";

const PATH = "/tl.kv.v1.KvTransfer/PushKv";
const encoder = new TextEncoder();
/** Bound on a head without its handle: gRPC prefix 5, tags 6, four varints ≤ 5 each, fixed64 8, fixed32 4, handle length varint ≤ 5. */
const HEAD_FIXED = 5 + 6 + 20 + 8 + 4 + 5;

export interface GrpcPushOptions {
  timeoutMs: number;
  /** Largest reply accepted. */
  maxReplyBytes: number;
  signal?: AbortSignal;
  /** W3C traceparent, sent as gRPC metadata. */
  traceparent?: string;
  /** The gateway replica the push was asked for: KvChunk.owner, on the first chunk. */
  owner?: string;
}

function varint(b: Uint8Array, o: number, v: number): number {
  while (v > 0x7f) {
    b[o++] = (v & 0x7f) | 0x80;
    v >>>= 7;
  }
  b[o++] = v;
  return o;
}

function varintBytes(v: number): number {
  let n = 1;
  while (v > 0x7f) {
    v >>>= 7;
    n++;
  }
  return n;
}

/**
 * Writes the head of one KvChunk message at `o`: the gRPC prefix and fields 1-5 and 7
 * (proto3: zero values omitted, as Connect's encoder does), then field 6's tag and
 * length; the envelope bytes follow it on the wire. Field 8 (owner), when given, goes
 * before field 6: the envelope's bytes must come last. Returns the end offset.
 */
function encodeChunkHead(b: Uint8Array, o: number, c: KvChunkLike, handle: Uint8Array, owner?: Uint8Array): number {
  const env = c.envelope.length;
  let body = 0;
  if (owner !== undefined && owner.length > 0) body += 1 + varintBytes(owner.length) + owner.length;
  if (handle.length > 0) body += 1 + varintBytes(handle.length) + handle.length;
  if (c.index !== 0) body += 1 + varintBytes(c.index);
  if (c.total !== 0) body += 1 + varintBytes(c.total);
  if (c.hash !== 0n) body += 9;
  if (c.kvFormat !== 0) body += 1 + varintBytes(c.kvFormat);
  if (c.crc32c !== 0) body += 5;
  if (env > 0) body += 1 + varintBytes(env) + env;
  putGrpcPrefix(b, o, body);
  o += GRPC_PREFIX_BYTES;
  if (handle.length > 0) {
    b[o++] = 0x0a;
    o = varint(b, o, handle.length);
    b.set(handle, o);
    o += handle.length;
  }
  if (c.index !== 0) {
    b[o++] = 0x10;
    o = varint(b, o, c.index);
  }
  if (c.total !== 0) {
    b[o++] = 0x18;
    o = varint(b, o, c.total);
  }
  if (c.hash !== 0n) {
    b[o++] = 0x21;
    putU64(b, o, c.hash);
    o += 8;
  }
  if (c.kvFormat !== 0) {
    b[o++] = 0x28;
    o = varint(b, o, c.kvFormat);
  }
  if (c.crc32c !== 0) {
    b[o++] = 0x3d;
    putU32(b, o, c.crc32c);
    o += 4;
  }
  if (owner !== undefined && owner.length > 0) {
    b[o++] = 0x42;
    o = varint(b, o, owner.length);
    b.set(owner, o);
    o += owner.length;
  }
  if (env > 0) {
    b[o++] = 0x32;
    o = varint(b, o, env);
  }
  return o;
}

/**
 * One PushKv call on `sm`'s connection. Resolves with the ack, or rejects with a
 * TransferError carrying the server's status (a refusal mid-push stops the writes and
 * reports the refusal), DEADLINE_EXCEEDED, CANCELLED on `signal`, or UNAVAILABLE when
 * the connection breaks. Any end but a clean one resets the stream, so D frees the push.
 */
export async function grpcPush(
  sm: Http2SessionManager,
  target: string,
  chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>,
  opts: GrpcPushOptions,
): Promise<KvAckLike> {
  const what = `PushKv to ${target}`;
  if (opts.signal?.aborted) throw new TransferError(Code.Canceled, `${what}: cancelled`);
  let stream: http2.ClientHttp2Stream;
  try {
    stream = await sm.request(
      "POST",
      PATH,
      {
        "content-type": "application/grpc+proto",
        te: "trailers",
        "grpc-timeout": `${Math.max(1, Math.ceil(opts.timeoutMs))}m`,
        ...(opts.traceparent !== undefined ? { traceparent: opts.traceparent } : {}),
      },
      {},
    );
  } catch (e) {
    throw new TransferError(Code.Unavailable, `${what}: ${e instanceof Error ? e.message : String(e)}`);
  }
  return new PushCall(sm, stream, what, opts).run(chunks);
}

/**
 * One PushKv stream's outcome: the first of a status from the server, a local stop
 * (deadline, cancel, failed producer) or a broken stream decides it.
 */
class PushCall {
  private outcome: TransferError | KvAckLike | undefined;
  private settle!: () => void;
  private readonly settled = new Promise<void>((resolve) => (this.settle = resolve));
  private rx = new Uint8Array(0);
  private reply: Uint8Array | undefined;

  constructor(
    private readonly sm: Http2SessionManager,
    private readonly stream: http2.ClientHttp2Stream,
    private readonly what: string,
    private readonly opts: GrpcPushOptions,
  ) {
    stream.on("response", (h) => this.onResponse(h));
    stream.on("data", (buf: Uint8Array) => this.onData(buf));
    stream.on("trailers", (h) => {
      const st = grpcStatusOf(h);
      if (st !== undefined) this.finishWith(st);
    });
    // Errors surface as the close below (or as the status already decided).
    stream.on("error", () => {});
    stream.on("close", () => {
      // Not our own cancel (that decided already): the connection or the peer broke, which
      // callers retry elsewhere.
      this.decide(new TransferError(Code.Unavailable, `${what}: stream closed without a status (HTTP/2 code ${stream.rstCode ?? 0})`));
    });
  }

  /** Writes the chunks (a refusal mid-push stops the writes) and waits for the outcome. */
  async run(chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>): Promise<KvAckLike> {
    const { opts, what } = this;
    const timer = setTimeout(() => this.stop(new TransferError(Code.DeadlineExceeded, `${what}: no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    const onAbort = () => this.stop(new TransferError(Code.Canceled, `${what}: cancelled`));
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const writing = writeChunks(this.stream, chunks, () => this.outcome !== undefined, this.opts.owner).then(
        (complete) => {
          if (complete && this.outcome === undefined) this.stream.end();
        },
        (e: unknown) => this.stop(new TransferError(Code.Internal, `${what}: ${e instanceof Error ? e.message : String(e)}`)),
      );
      // A slow producer does not hold up an outcome that is already decided.
      await Promise.race([writing, this.settled]);
      await this.settled;
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
    }
    if (this.outcome instanceof TransferError) throw this.outcome;
    return this.outcome!;
  }

  private decide(o: TransferError | KvAckLike): void {
    if (this.outcome !== undefined) return;
    this.outcome = o;
    this.settle();
  }

  /** Decides with `e` and resets the stream: D frees the push. */
  private stop(e: TransferError): void {
    this.decide(e);
    if (!this.stream.closed) this.stream.close(http2.constants.NGHTTP2_CANCEL);
  }

  private onResponse(h: http2.IncomingHttpHeaders): void {
    const httpStatus = Number(h[":status"] ?? 0);
    // A trailers-only response (an immediate refusal) carries its status in the headers.
    const st = grpcStatusOf(h);
    if (st !== undefined) this.finishWith(st);
    else if (httpStatus !== 200) this.stop(new TransferError(codeOfHttpStatus(httpStatus), `${this.what}: HTTP status ${httpStatus}`));
  }

  /** The reply (one small KvAck) gathered; anything past it is ignored. */
  private onData(buf: Uint8Array): void {
    this.sm.notifyResponseByteRead(this.stream);
    if (this.reply !== undefined) return;
    const max = this.opts.maxReplyBytes;
    if (this.rx.length + buf.length > max + GRPC_PREFIX_BYTES) {
      this.stop(new TransferError(Code.ResourceExhausted, `${this.what}: reply over ${max} bytes`));
      return;
    }
    const joined = new Uint8Array(this.rx.length + buf.length);
    joined.set(this.rx);
    joined.set(buf, this.rx.length);
    this.rx = joined;
    if (this.rx.length < GRPC_PREFIX_BYTES) return;
    if (this.rx[0] !== 0) {
      this.stop(new TransferError(Code.Internal, `${this.what}: compressed reply (flags ${this.rx[0]})`));
      return;
    }
    const len = grpcMessageLength(this.rx, 0);
    if (this.rx.length >= GRPC_PREFIX_BYTES + len) this.reply = this.rx.subarray(GRPC_PREFIX_BYTES, GRPC_PREFIX_BYTES + len);
  }

  private finishWith(st: { code: number; message: string }): void {
    if (st.code !== 0) this.decide(new TransferError(st.code, `${this.what}: ${st.message}`));
    else if (this.reply === undefined) this.decide(new TransferError(Code.Internal, `${this.what}: status OK without a reply`));
    else this.decide(this.ackOf(this.reply));
    // A refusal may arrive while our side is still open: reset it, we are done.
    if (st.code !== 0 && !this.stream.closed) this.stream.close(http2.constants.NGHTTP2_CANCEL);
  }

  private ackOf(reply: Uint8Array): KvAckLike | TransferError {
    try {
      const ack = fromBinary(KvAckSchema, reply);
      return {
        handleId: ack.handleId,
        blocksReceived: ack.blocksReceived,
        blocksDeduped: ack.blocksDeduped,
        payloadBytes: ack.payloadBytes,
        nTokens: ack.nTokens,
      };
    } catch (e) {
      return new TransferError(Code.Internal, `${this.what}: bad reply: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
}

const STAGE_BYTES = 1024 * 1024;
const spareStages: Uint8Array[] = [];

/**
 * Writes every chunk through two alternating stage buffers of 1 MiB: one is written
 * while the other fills, and a stage is refilled only after its write completed, so the
 * stream never queues more than one write (Bun's http2 concatenates queued writes into
 * a fresh buffer: writing head and envelope separately cost more than this one copy).
 * Returns false when `done()` turned true (an outcome arrived) before the last chunk.
 */
async function writeChunks(
  stream: http2.ClientHttp2Stream,
  chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>,
  done: () => boolean,
  ownerId?: string,
): Promise<boolean> {
  // Only the first chunk names the owner: the receiver binds the push to it when it opens.
  let owner = ownerId ? encoder.encode(ownerId) : undefined;
  const stages = [spareStages.pop() ?? new Uint8Array(STAGE_BYTES), spareStages.pop() ?? new Uint8Array(STAGE_BYTES)];
  let cur = 0;
  let used = 0;
  let inflight: Promise<void> = Promise.resolve();
  let handle = "";
  let hb = new Uint8Array(0);
  const flush = async (): Promise<void> => {
    if (used === 0) return;
    const b = stages[cur]!.subarray(0, used);
    await inflight;
    if (done()) return;
    inflight = new Promise<void>((resolve) => stream.write(b, () => resolve()));
    cur ^= 1;
    used = 0;
  };
  const one = async (c: KvChunkLike): Promise<boolean> => {
    if (c.handleId !== handle) {
      handle = c.handleId;
      hb = encoder.encode(handle);
    }
    const headMax = HEAD_FIXED + hb.length + (owner === undefined ? 0 : 5 + owner.length);
    if (used + headMax + c.envelope.length > STAGE_BYTES) await flush();
    if (done()) return false;
    const st = stages[cur]!;
    if (headMax + c.envelope.length > STAGE_BYTES) {
      // Bigger than a stage: head staged, the envelope written as it is.
      used = encodeChunkHead(st, 0, c, hb, owner);
      owner = undefined;
      await flush();
      await inflight;
      if (done()) return false;
      inflight = new Promise<void>((resolve) => stream.write(c.envelope, () => resolve()));
      return !done();
    }
    used = encodeChunkHead(st, used, c, hb, owner);
    owner = undefined;
    st.set(c.envelope, used);
    used += c.envelope.length;
    return true;
  };
  try {
    if (Array.isArray(chunks)) {
      for (const c of chunks as readonly KvChunkLike[]) if (!(await one(c))) return false;
    } else {
      for await (const c of chunks as AsyncIterable<KvChunkLike>) {
        if (!(await one(c))) return false;
        // A producer may be slow: what it gave goes out now.
        await flush();
      }
    }
    await flush();
    await inflight;
    return !done();
  } finally {
    // A stage still queued in a stream that was cut is not reused.
    void inflight.then(() => {
      if (spareStages.length < 4) spareStages.push(...stages);
    });
  }
}
