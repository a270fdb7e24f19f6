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
import { KvAckSchema } from "../gen/tl/kv/v1/kv_pb.ts";
import type { KvAckLike, KvChunkLike } from "./kv-chunk.ts";
import { GRPC_PREFIX_BYTES, grpcMessageLength, grpcStatusOf, putGrpcPrefix } from "../rpc/grpc-wire.ts";
import { TransferError } from "./kv-error.ts";
import { Code, codeOfHttpStatus } from "../rpc/status.ts";
import { putU32, putU64 } from "../codec/index.ts";

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
 * length; the envelope bytes follow it on the wire. Returns the end offset.
 */
function encodeChunkHead(b: Uint8Array, o: number, c: KvChunkLike, handle: Uint8Array): number {
  const env = c.envelope.length;
  let body = 0;
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

  // The outcome: the first of a status from the server, a local stop (deadline, cancel,
  // failed producer) or a broken stream decides it.
  let outcome: TransferError | KvAckLike | undefined;
  let settle!: () => void;
  const settled = new Promise<void>((resolve) => (settle = resolve));
  const decide = (o: TransferError | KvAckLike) => {
    if (outcome !== undefined) return;
    outcome = o;
    settle();
  };
  const stop = (e: TransferError) => {
    decide(e);
    if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
  };

  let httpStatus = 0;
  let rx = new Uint8Array(0);
  let reply: Uint8Array | undefined;
  stream.on("response", (h) => {
    httpStatus = Number(h[":status"] ?? 0);
    // A trailers-only response (an immediate refusal) carries its status in the headers.
    const st = grpcStatusOf(h);
    if (st !== undefined) finishWith(st);
    else if (httpStatus !== 200) stop(new TransferError(codeOfHttpStatus(httpStatus), `${what}: HTTP status ${httpStatus}`));
  });
  stream.on("data", (buf: Uint8Array) => {
    sm.notifyResponseByteRead(stream);
    if (reply !== undefined) return;
    if (rx.length + buf.length > opts.maxReplyBytes + 5) {
      stop(new TransferError(Code.ResourceExhausted, `${what}: reply over ${opts.maxReplyBytes} bytes`));
      return;
    }
    const joined = new Uint8Array(rx.length + buf.length);
    joined.set(rx);
    joined.set(buf, rx.length);
    rx = joined;
    if (rx.length < GRPC_PREFIX_BYTES) return;
    const len = grpcMessageLength(rx, 0);
    if (rx[0] !== 0) {
      stop(new TransferError(Code.Internal, `${what}: compressed reply (flags ${rx[0]})`));
      return;
    }
    if (rx.length >= GRPC_PREFIX_BYTES + len) reply = rx.subarray(GRPC_PREFIX_BYTES, GRPC_PREFIX_BYTES + len);
  });
  stream.on("trailers", (h) => {
    const st = grpcStatusOf(h);
    if (st !== undefined) finishWith(st);
  });
  // Errors surface as the close below (or as the status already decided).
  stream.on("error", () => {});
  stream.on("close", () => {
    if (outcome !== undefined) return;
    // Not our own cancel (that decided already): the connection or the peer broke, which
    // callers retry elsewhere.
    decide(new TransferError(Code.Unavailable, `${what}: stream closed without a status (HTTP/2 code ${stream.rstCode ?? 0})`));
  });

  function finishWith(st: { code: number; message: string }): void {
    if (st.code !== 0) {
      decide(new TransferError(st.code, `${what}: ${st.message}`));
    } else if (reply === undefined) {
      decide(new TransferError(Code.Internal, `${what}: status OK without a reply`));
    } else {
      try {
        const ack = fromBinary(KvAckSchema, reply);
        decide({
          handleId: ack.handleId,
          blocksReceived: ack.blocksReceived,
          blocksDeduped: ack.blocksDeduped,
          payloadBytes: ack.payloadBytes,
          nTokens: ack.nTokens,
        });
      } catch (e) {
        decide(new TransferError(Code.Internal, `${what}: bad reply: ${e instanceof Error ? e.message : String(e)}`));
      }
    }
    // A refusal may arrive while our side is still open: reset it, we are done.
    if (st.code !== 0 && !stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
  }

  const timer = setTimeout(
    () => stop(new TransferError(Code.DeadlineExceeded, `${what}: no answer within ${opts.timeoutMs} ms`)),
    opts.timeoutMs,
  );
  const onAbort = () => stop(new TransferError(Code.Canceled, `${what}: cancelled`));
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const writing = writeChunks(stream, chunks, () => outcome !== undefined).then(
      (complete) => {
        if (complete && outcome === undefined) stream.end();
      },
      (e: unknown) => stop(new TransferError(Code.Internal, `${what}: ${e instanceof Error ? e.message : String(e)}`)),
    );
    // A slow producer does not hold up an outcome that is already decided.
    await Promise.race([writing, settled]);
    await settled;
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener("abort", onAbort);
  }
  if (outcome instanceof TransferError) throw outcome;
  return outcome!;
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
): Promise<boolean> {
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
    const headMax = HEAD_FIXED + hb.length;
    if (used + headMax + c.envelope.length > STAGE_BYTES) await flush();
    if (done()) return false;
    const st = stages[cur]!;
    if (headMax + c.envelope.length > STAGE_BYTES) {
      // Bigger than a stage: head staged, the envelope written as it is.
      used = encodeChunkHead(st, 0, c, hb);
      await flush();
      await inflight;
      if (done()) return false;
      inflight = new Promise<void>((resolve) => stream.write(c.envelope, () => resolve()));
      return !done();
    }
    used = encodeChunkHead(st, used, c, hb);
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
