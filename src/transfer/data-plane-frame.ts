// Framing of the binary data plane: the chunks of tl.kv.v1 PushKv without HTTP/2 or
// protobuf, so a push costs at most one memcpy on each side beyond the socket itself.
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
//   ACK   (D→P) u32 blocks_received, u32 blocks_deduped, u64 payload_bytes, u32 n_tokens
//   ERROR (D→P) u32 gRPC code, message (UTF-8)
// After an ERROR, D discards the rest of that connection's input until P hangs up:
// closing at once could reset the connection before P reads the ERROR.

export const FRAME_CHUNK = 1;
export const FRAME_END = 2;
export const FRAME_TRACE = 3;
export const FRAME_RUN = 4;
export const FRAME_ACK = 0x81;
export const FRAME_ERROR = 0x82;

/** length prefix + type */
export const FRAME_HEAD = 5;
/** CHUNK body before the handle */
export const CHUNK_FIXED = 4 + 4 + 8 + 4 + 4 + 2;
export const ACK_BODY = 4 + 4 + 8 + 4;
/** RUN body before the handle */
export const RUN_FIXED = 4 + 4 + 4 + 4 + 4 + 2;
/** One RUN entry: hash, chunk CRC, envelope head (40), envelope trailer. */
export const RUN_ENTRY = 8 + 4 + 40 + 4;
/** Chunks one RUN frame may carry (its entries are buffered whole on D). */
export const MAX_RUN = 1024;
export const MAX_HANDLE_BYTES = 0xffff;
/** A traceparent is 55 bytes; room for future versions, refused beyond. */
export const MAX_TRACE_BYTES = 256;

// Little-endian fields, allocation-free u64 included: the envelope fast path's.
export { getU32, getU64, putU32, putU64 } from "./one-block-envelope.ts";

export function splitHostPort(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(":");
  if (i < 0) throw new Error(`address ${address} is not host:port`);
  return { host: address.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(address.slice(i + 1)) };
}
