// Framing of the binary data plane: the chunks of tl.kv.v1 PushKv without HTTP/2 or
// protobuf, so a push costs one memcpy on each side beyond the socket itself.
//
// Every frame: u32 length of what follows, u8 type, then the body. Little-endian.
//   CHUNK (P→D) u32 index, u32 total, u64 hash, u32 kv_format, u32 crc32c,
//               u16 handle length, handle (UTF-8), envelope (the rest; empty = dedup)
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
export const FRAME_ACK = 0x81;
export const FRAME_ERROR = 0x82;

/** length prefix + type */
export const FRAME_HEAD = 5;
/** CHUNK body before the handle */
export const CHUNK_FIXED = 4 + 4 + 8 + 4 + 4 + 2;
export const ACK_BODY = 4 + 4 + 8 + 4;
export const MAX_HANDLE_BYTES = 0xffff;
/** A traceparent is 55 bytes; room for future versions, refused beyond. */
export const MAX_TRACE_BYTES = 256;

export function putU32(b: Uint8Array, o: number, v: number): void {
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
  b[o + 2] = (v >>> 16) & 0xff;
  b[o + 3] = (v >>> 24) & 0xff;
}

export function getU32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

// Allocation-free u64 access, shared with the envelope fast path.
export { getU64, putU64 } from "./one-block-envelope.ts";

export function splitHostPort(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(":");
  if (i < 0) throw new Error(`address ${address} is not host:port`);
  return { host: address.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(address.slice(i + 1)) };
}
