// The binary data plane's frames: the chunks of tl.kv.v1 PushKv without HTTP/2 or
// protobuf, so a push costs at most one memcpy on each side beyond the socket itself.
// This module is the one place their layout lives: client, server and test support
// encode and decode through it.
//
// Every frame: u32 length of what follows, u8 type, then the body. Little-endian.
//   CHUNK (P→D) u32 index, u32 total, u64 hash, u32 kv_format, u32 crc32c,
//               u16 handle length, handle (UTF-8), envelope (the rest; empty = dedup)
//   RUN   (P→D) u32 first index, u32 count k, u32 total, u32 kv_format, u32 payload bytes P,
//               u16 handle length, handle (UTF-8), then k entries of RUN_ENTRY bytes:
//                 u64 hash, u32 crc32c (the chunk's fields), the envelope's first 40 bytes
//                 (header, record head), u32 the envelope's trailing CRC field;
//               after the frame (outside its length), the k payloads, P bytes each, back
//               to back. Chunks first..first+k-1 of one push, each a one-block envelope
//               cut in three (head, payload, trailer): the same bytes, the same checks.
//               The payloads travel apart from their heads so a prefill engine can hand
//               a run of blocks adjacent in its pool to the socket as they lie, no copy.
//   END   (P→D) nothing: the push ended cleanly; D answers ACK or ERROR
//   TRACE (P→D) a W3C traceparent (ASCII): optional, only when P traces, before a push's
//               first CHUNK; names the parent of D's kv.transfer span for that push
//   OWNER (P→D) the gateway replica the push was asked for (UTF-8, at most 128 bytes):
//               optional, before a push's first CHUNK or RUN; D binds the handle to it
//   ACK   (D→P) u32 blocks_received, u32 blocks_deduped, u64 payload_bytes, u32 n_tokens
//   ERROR (D→P) u32 gRPC code, message (UTF-8)
// After an ERROR, D discards the rest of that connection's input until P hangs up:
// closing at once could reset the connection before P reads the ERROR.
import { ENVELOPE_HEAD_BYTES, getU16, getU32, getU64, putU16, putU32, putU64 } from "../../codec/index.ts";
import { Code } from "../../rpc/status.ts";
import type { KvAckLike, KvChunkLike } from "./kv-chunk.ts";
import { KvError } from "./kv-error.ts";

export const FRAME_CHUNK = 1;
export const FRAME_END = 2;
export const FRAME_TRACE = 3;
export const FRAME_RUN = 4;
export const FRAME_OWNER = 5;
export const FRAME_ACK = 0x81;
export const FRAME_ERROR = 0x82;

/** length prefix + type */
export const FRAME_HEAD = 5;
/** CHUNK body before the handle */
export const CHUNK_FIXED = 4 + 4 + 8 + 4 + 4 + 2;
export const ACK_BODY = 4 + 4 + 8 + 4;
/** RUN body before the handle */
export const RUN_FIXED = 4 + 4 + 4 + 4 + 4 + 2;
/** Where a RUN entry's envelope head starts: after its hash and chunk CRC. */
export const RUN_ENTRY_HEAD = 8 + 4;
/** One RUN entry: hash, chunk CRC, envelope head (40), envelope trailer. */
export const RUN_ENTRY = RUN_ENTRY_HEAD + ENVELOPE_HEAD_BYTES + 4;
/** Chunks one RUN frame may carry (its entries are buffered whole on D). */
export const MAX_RUN = 1024;
export const MAX_HANDLE_BYTES = 0xffff;
/** A traceparent is 55 bytes; room for future versions, refused beyond. */
export const MAX_TRACE_BYTES = 256;
/** An owner is a worker id (peer-identity.ts): at most 128 bytes. */
export const MAX_OWNER_BYTES = 128;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Bytes of the frame starting at `b[o]`, its length prefix included (the prefix must be there). */
export function frameBytes(b: Uint8Array, o: number): number {
  return 4 + getU32(b, o);
}

/** Writes the length prefix and type of a frame of `bytes` bytes (prefix included) at `b[o]`. */
function putFrameHead(b: Uint8Array, o: number, type: number, bytes: number): void {
  putU32(b, o, bytes - 4);
  b[o + 4] = type;
}

/** A CHUNK's fields as they travel: the chunk's own but its handle, which the frame carries as bytes. */
export type ChunkFields = Omit<KvChunkLike, "handleId">;

/** Bytes of a CHUNK frame before its envelope, for a handle of `handleBytes`. */
export function chunkHeadBytes(handleBytes: number): number {
  return FRAME_HEAD + CHUNK_FIXED + handleBytes;
}

/**
 * Writes a CHUNK frame's head for `c` at `out[o..]`, `crc` as its crc32c field and an
 * envelope of `envelopeBytes` to follow; returns where the envelope goes.
 */
export function encodeChunkHead(
  out: Uint8Array,
  o: number,
  c: Omit<ChunkFields, "envelope" | "crc32c">,
  crc: number,
  handle: Uint8Array,
  envelopeBytes: number,
): number {
  const head = chunkHeadBytes(handle.length);
  putFrameHead(out, o, FRAME_CHUNK, head + envelopeBytes);
  const b = o + FRAME_HEAD;
  putU32(out, b, c.index);
  putU32(out, b + 4, c.total);
  putU64(out, b + 8, c.hash);
  putU32(out, b + 16, c.kvFormat);
  putU32(out, b + 20, crc);
  putU16(out, b + 24, handle.length);
  out.set(handle, b + CHUNK_FIXED);
  return o + head;
}

/** A whole CHUNK frame for `c` (tests and tools; the client stages its frames in place). */
export function encodeChunk(c: KvChunkLike): Uint8Array {
  const handle = encoder.encode(c.handleId);
  const f = new Uint8Array(chunkHeadBytes(handle.length) + c.envelope.length);
  f.set(c.envelope, encodeChunkHead(f, 0, c, c.crc32c, handle, c.envelope.length));
  return f;
}

/** Reads the CHUNK frame `f` into `into` (envelope a view into `f`); returns the handle's bytes, a view too. */
export function decodeChunk(f: Uint8Array, into: ChunkFields): Uint8Array {
  if (f.length < FRAME_HEAD + CHUNK_FIXED) throw new KvError(Code.InvalidArgument, `chunk frame of ${f.length} bytes`);
  const o = FRAME_HEAD;
  const hl = getU16(f, o + 24);
  const eo = o + CHUNK_FIXED + hl;
  if (eo > f.length) throw new KvError(Code.InvalidArgument, `chunk frame of ${f.length} bytes, handle of ${hl}`);
  into.index = getU32(f, o);
  into.total = getU32(f, o + 4);
  into.hash = getU64(f, o + 8);
  into.kvFormat = getU32(f, o + 16);
  into.crc32c = getU32(f, o + 20);
  into.envelope = f.subarray(eo);
  return f.subarray(o + CHUNK_FIXED, eo);
}

/** A RUN frame's head fields; `entries` its k entries. */
export interface RunHead {
  first: number;
  count: number;
  total: number;
  kvFormat: number;
  payloadBytes: number;
  entries: Uint8Array;
}

/** Bytes of a RUN frame (payloads apart) of `count` entries, for a handle of `handleBytes`. */
export function runFrameBytes(handleBytes: number, count: number): number {
  return FRAME_HEAD + RUN_FIXED + handleBytes + count * RUN_ENTRY;
}

/** Writes a RUN frame's head at `out[o..]`; returns where its first entry goes. */
export function encodeRunHead(out: Uint8Array, o: number, h: Omit<RunHead, "entries">, handle: Uint8Array): number {
  putFrameHead(out, o, FRAME_RUN, runFrameBytes(handle.length, h.count));
  const b = o + FRAME_HEAD;
  putU32(out, b, h.first);
  putU32(out, b + 4, h.count);
  putU32(out, b + 8, h.total);
  putU32(out, b + 12, h.kvFormat);
  putU32(out, b + 16, h.payloadBytes);
  putU16(out, b + 20, handle.length);
  out.set(handle, b + RUN_FIXED);
  return b + RUN_FIXED + handle.length;
}

/** Reads the RUN frame `f` into `into` (entries a view into `f`); returns the handle's bytes, a view too. */
export function decodeRun(f: Uint8Array, into: RunHead): Uint8Array {
  if (f.length < FRAME_HEAD + RUN_FIXED) throw new KvError(Code.InvalidArgument, `run frame of ${f.length} bytes`);
  const o = FRAME_HEAD;
  const count = getU32(f, o + 4);
  const hl = getU16(f, o + 20);
  const eo = o + RUN_FIXED + hl;
  if (count < 1 || count > MAX_RUN) throw new KvError(Code.InvalidArgument, `run of ${count} chunks, want 1..${MAX_RUN}`);
  if (f.length !== eo + count * RUN_ENTRY) {
    throw new KvError(Code.InvalidArgument, `run frame of ${f.length} bytes, want ${eo + count * RUN_ENTRY} for ${count} chunks and a handle of ${hl}`);
  }
  into.first = getU32(f, o);
  into.count = count;
  into.total = getU32(f, o + 8);
  into.kvFormat = getU32(f, o + 12);
  into.payloadBytes = getU32(f, o + 16);
  into.entries = f.subarray(eo);
  return f.subarray(o + RUN_FIXED, eo);
}

/** Writes a RUN entry's fields at `out[e..]` around its envelope head (written at e + RUN_ENTRY_HEAD by the caller). */
export function putRunEntry(out: Uint8Array, e: number, hash: bigint, chunkCrc: number, trailer: number): void {
  putU64(out, e, hash);
  putU32(out, e + 8, chunkCrc);
  putU32(out, e + RUN_ENTRY - 4, trailer);
}

/** The fields of the RUN entry at `run[e..]`. */
export function runEntryHash(run: Uint8Array, e: number): bigint {
  return getU64(run, e);
}
export function runEntryCrc(run: Uint8Array, e: number): number {
  return getU32(run, e + 8);
}
export function runEntryTrailer(run: Uint8Array, e: number): number {
  return getU32(run, e + RUN_ENTRY - 4);
}

/** Writes an END frame at `out[o..]`; returns its end. */
export function encodeEnd(out: Uint8Array, o: number): number {
  putFrameHead(out, o, FRAME_END, FRAME_HEAD);
  return o + FRAME_HEAD;
}

/** Writes a TRACE frame carrying `traceparent` (ASCII bytes) at `out[o..]`; returns its end. */
export function encodeTrace(out: Uint8Array, o: number, traceparent: Uint8Array): number {
  putFrameHead(out, o, FRAME_TRACE, FRAME_HEAD + traceparent.length);
  out.set(traceparent, o + FRAME_HEAD);
  return o + FRAME_HEAD + traceparent.length;
}

/** Writes an OWNER frame carrying `owner` (UTF-8 bytes) at `out[o..]`; returns its end. */
export function encodeOwner(out: Uint8Array, o: number, owner: Uint8Array): number {
  putFrameHead(out, o, FRAME_OWNER, FRAME_HEAD + owner.length);
  out.set(owner, o + FRAME_HEAD);
  return o + FRAME_HEAD + owner.length;
}

/** The owner of the OWNER frame `f`; refuses one over MAX_OWNER_BYTES. */
export function decodeOwner(f: Uint8Array): string {
  if (f.length - FRAME_HEAD > MAX_OWNER_BYTES) {
    throw new KvError(Code.InvalidArgument, `owner frame of ${f.length} bytes, limit ${FRAME_HEAD + MAX_OWNER_BYTES}`);
  }
  return decoder.decode(f.subarray(FRAME_HEAD));
}

/** The traceparent of the TRACE frame `f`; refuses one over MAX_TRACE_BYTES. */
export function decodeTrace(f: Uint8Array): string {
  if (f.length - FRAME_HEAD > MAX_TRACE_BYTES)
    throw new KvError(Code.InvalidArgument, `trace frame of ${f.length} bytes, limit ${FRAME_HEAD + MAX_TRACE_BYTES}`);
  return decoder.decode(f.subarray(FRAME_HEAD));
}

/** D's answer to a push, without the handle (P knows it). */
export type AckBody = Omit<KvAckLike, "handleId">;

export function encodeAck(ack: AckBody): Uint8Array {
  const r = new Uint8Array(FRAME_HEAD + ACK_BODY);
  putFrameHead(r, 0, FRAME_ACK, r.length);
  putU32(r, 5, ack.blocksReceived);
  putU32(r, 9, ack.blocksDeduped);
  putU64(r, 13, ack.payloadBytes);
  putU32(r, 21, ack.nTokens);
  return r;
}

export function encodeError(code: number, message: string): Uint8Array {
  const msg = encoder.encode(message);
  const r = new Uint8Array(FRAME_HEAD + 4 + msg.length);
  putFrameHead(r, 0, FRAME_ERROR, r.length);
  putU32(r, 5, code);
  r.set(msg, FRAME_HEAD + 4);
  return r;
}

/** What a reply frame from D says: an ACK, an ERROR, or something this client does not read. */
export type Reply = { kind: "ack"; ack: AckBody } | { kind: "error"; code: number; message: string } | { kind: "unknown"; type: number };

/** Decodes the whole reply frame `r` (D→P). */
export function decodeReply(r: Uint8Array): Reply {
  const type = r[4] ?? 0;
  if (type === FRAME_ACK && r.length >= FRAME_HEAD + ACK_BODY) {
    return { kind: "ack", ack: { blocksReceived: getU32(r, 5), blocksDeduped: getU32(r, 9), payloadBytes: getU64(r, 13), nTokens: getU32(r, 21) } };
  }
  if (type === FRAME_ERROR && r.length >= FRAME_HEAD + 4) return { kind: "error", code: getU32(r, 5), message: decoder.decode(r.subarray(FRAME_HEAD + 4)) };
  return { kind: "unknown", type };
}
