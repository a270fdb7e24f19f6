// gRPC's length prefix, ahead of every message on the wire: a flags byte (bit 0: the
// message is compressed) and the message length, u32 big-endian. Shared by PushKv's
// hand-written client (grpc-push.ts) and server (grpc-push-server.ts).

export const GRPC_PREFIX_BYTES = 5;

/** Writes an uncompressed message's prefix for `length` bytes at `b[o]`. */
export function putGrpcPrefix(b: Uint8Array, o: number, length: number): void {
  b[o] = 0;
  b[o + 1] = length >>> 24;
  b[o + 2] = (length >>> 16) & 0xff;
  b[o + 3] = (length >>> 8) & 0xff;
  b[o + 4] = length & 0xff;
}

/** The message length in the prefix at `b[o]` (its flags are `b[o]`). */
export function grpcMessageLength(b: Uint8Array, o: number): number {
  return ((b[o + 1]! << 24) | (b[o + 2]! << 16) | (b[o + 3]! << 8) | b[o + 4]!) >>> 0;
}
