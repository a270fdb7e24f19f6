// gRPC over HTTP/2 as the hand-written PushKv client and server speak it, and as the
// server refuses a call before any handler: the length prefix ahead of every message
// (a flags byte, bit 0 = compressed, then the length, u32 big-endian) and the status a
// response carries in its headers or trailers (grpc-status, percent-encoded grpc-message).
import type * as http2 from "node:http2";
import { Code } from "./status.ts";

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

/** What the gRPC status in response headers or trailers says, or undefined while there is none. */
export function grpcStatusOf(h: http2.IncomingHttpHeaders): { code: number; message: string } | undefined {
  const s = h["grpc-status"];
  if (s === undefined) return undefined;
  const code = Number(Array.isArray(s) ? s[0] : s);
  const raw = h["grpc-message"];
  let message = Array.isArray(raw) ? (raw[0] ?? "") : (raw ?? "");
  try {
    message = decodeURIComponent(message);
  } catch {
    // not percent-encoded after all: keep it as sent
  }
  return { code: Number.isInteger(code) ? code : Code.Unknown, message };
}

/**
 * Ends a gRPC response: `body` (already length-prefixed messages) if any, then the
 * status as trailers, or the status in the headers alone (`trailersOnly`, a refusal
 * before any handler). Nothing when the response is already under way or gone.
 */
export function sendGrpcStatus(
  res: http2.Http2ServerResponse,
  contentType: string,
  code: number,
  message: string,
  body?: Uint8Array,
  trailersOnly = false,
): void {
  if (res.headersSent || res.destroyed) return;
  const status = code === 0 ? { "grpc-status": "0" } : { "grpc-status": String(code), "grpc-message": encodeURIComponent(message) };
  if (trailersOnly) {
    // One HEADERS frame that ends the stream (gRPC's Trailers-Only). writeHead + end sends the
    // headers, then ends the stream apart (and, the request still open, resets it with
    // NO_ERROR): grpc-js reads that as headers without a status and reports INTERNAL
    // "RST_STREAM code 0" instead of the code given here.
    res.stream.respond({ ":status": 200, "content-type": contentType, ...status }, { endStream: true });
    return;
  }
  res.writeHead(200, { "content-type": contentType });
  if (body !== undefined) res.write(body);
  res.addTrailers(status);
  res.end();
}
