// PushKv served straight off the HTTP/2 request, ahead of Connect's adapter.
//
// Connect's server gathers every gRPC message into a fresh zeroed buffer before
// decoding it; for a push of 32 KiB envelopes that allocation and copy were most of the
// decode engine's CPU (bench/transfer.ts). Here a message that arrives whole in one
// DATA chunk is decoded where it lies, and one split across chunks is gathered in a
// buffer reused for the whole stream; the receiver copies what it keeps. Only plain
// gRPC with identity encoding is taken: gRPC-web, the Connect protocol, compressed
// streams and every other method still go to Connect, which answers them as before.
import type * as http2 from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { KvAckSchema, KvChunkSchema } from "../gen/tl/kv/v1/kv_pb.ts";
import { endSpan, extractHeaders, SpanKind, startSpan, type Span } from "../obs/index.ts";
import { GRPC_PREFIX_BYTES, grpcMessageLength, putGrpcPrefix } from "./grpc-prefix.ts";
import { ackSpanAttributes } from "./kv-chunk.ts";
import { PUSH_ATTRS } from "./kv-service.ts";
import { KvError } from "./kv-error.ts";
import { Code } from "../rpc/status.ts";
import type { KvReceiver, PushSession } from "./kv-receiver.ts";

const PATH = "/tl.kv.v1.KvTransfer/PushKv";

/**
 * PushKv over `receiver`, messages up to `maxMessageBytes` (larger: RESOURCE_EXHAUSTED
 * before the body is read). Returns false, having touched nothing, for any other request.
 */
export function pushKvHandler(receiver: KvReceiver, maxMessageBytes: number): (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean {
  return (req, res) => {
    if (req.method !== "POST" || req.url !== PATH) return false;
    const type = req.headers["content-type"];
    if (type !== "application/grpc" && type !== "application/grpc+proto") return false;
    const enc = req.headers["grpc-encoding"];
    if (enc !== undefined && enc !== "identity") return false;
    new PushStream(receiver, maxMessageBytes, req, res, type).start();
    return true;
  };
}

/** One PushKv call: gRPC length-prefixed messages parsed as they arrive. */
class PushStream {
  private session: PushSession | undefined;
  /** answered (ACK or error): what still arrives is discarded */
  private answered = false;
  private readonly prefix = new Uint8Array(GRPC_PREFIX_BYTES);
  private prefixHave = 0;
  /** length of the message being read, or -1 while reading a prefix */
  private need = -1;
  /** a message split across DATA chunks, gathered */
  private gather = new Uint8Array(0);
  private have = 0;
  private readonly span: Span;

  constructor(
    private readonly rx: KvReceiver,
    private readonly maxBytes: number,
    private readonly req: http2.Http2ServerRequest,
    private readonly res: http2.Http2ServerResponse,
    private readonly contentType: string,
  ) {
    // Child of P's kv.transfer CLIENT span, named by the `traceparent` metadata.
    const headers = new Headers();
    for (const k of ["traceparent", "tracestate"]) {
      const v = req.headers[k];
      if (typeof v === "string") headers.set(k, v);
    }
    this.span = startSpan("kv.transfer", SpanKind.SERVER, extractHeaders(headers), PUSH_ATTRS);
  }

  start(): void {
    this.req.on("data", (chunk: Uint8Array) => {
      if (!this.answered) this.onData(chunk);
    });
    this.req.on("end", () => this.onEnd());
    // A stream reset or a connection lost before the end: free what the push took.
    const gone = () => {
      if (this.answered) return;
      this.answered = true;
      this.session?.abort();
      endSpan(this.span, new KvError(Code.Canceled, "push stream closed before it ended"));
    };
    this.req.on("aborted", gone);
    this.req.on("error", gone);
    this.res.on("close", () => {
      if (!this.req.readableEnded) gone();
    });
  }

  private onData(buf: Uint8Array): void {
    const n = buf.length;
    let off = 0;
    try {
      while (off < n && !this.answered) {
        if (this.need < 0) {
          if (this.prefixHave === 0 && n - off >= GRPC_PREFIX_BYTES) {
            this.begin(buf[off]!, grpcMessageLength(buf, off));
            off += GRPC_PREFIX_BYTES;
          } else {
            const k = Math.min(GRPC_PREFIX_BYTES - this.prefixHave, n - off);
            this.prefix.set(buf.subarray(off, off + k), this.prefixHave);
            this.prefixHave += k;
            off += k;
            if (this.prefixHave < GRPC_PREFIX_BYTES) return;
            this.prefixHave = 0;
            this.begin(this.prefix[0]!, grpcMessageLength(this.prefix, 0));
          }
          if (this.need === 0) this.message(new Uint8Array(0));
          continue;
        }
        if (this.have === 0 && n - off >= this.need) {
          const len = this.need;
          this.need = -1;
          this.message(buf.subarray(off, off + len));
          off += len;
          continue;
        }
        if (this.gather.length < this.need) this.gather = new Uint8Array(this.need);
        const k = Math.min(this.need - this.have, n - off);
        this.gather.set(buf.subarray(off, off + k), this.have);
        this.have += k;
        off += k;
        if (this.have < this.need) return;
        const len = this.need;
        this.need = -1;
        this.have = 0;
        this.message(this.gather.subarray(0, len));
      }
    } catch (e) {
      this.fail(e);
    }
  }

  private begin(flags: number, len: number): void {
    if (flags & 1) throw new KvError(Code.Internal, "compressed message without a grpc-encoding");
    if (len > this.maxBytes) throw new KvError(Code.ResourceExhausted, `message size ${len} is larger than configured readMaxBytes ${this.maxBytes}`);
    this.need = len;
  }

  private message(bytes: Uint8Array): void {
    let c;
    try {
      c = fromBinary(KvChunkSchema, bytes);
    } catch (e) {
      throw new KvError(Code.InvalidArgument, `KvChunk message: ${e instanceof Error ? e.message : String(e)}`);
    }
    this.session ??= this.rx.begin(c.handleId, c.total);
    this.session.accept(c);
  }

  private onEnd(): void {
    if (this.answered) return;
    try {
      if (this.need >= 0 || this.prefixHave > 0) throw new KvError(Code.InvalidArgument, "stream ended inside a message");
      // As with Connect on Bun, a client that resets mid-stream can look like a clean
      // end here: finish() refuses a push short of its `total` chunks.
      const s = this.session;
      if (s === undefined) throw new KvError(Code.InvalidArgument, "empty push");
      this.session = undefined;
      const ack = s.finish();
      const msg = toBinary(KvAckSchema, create(KvAckSchema, ack));
      const body = new Uint8Array(GRPC_PREFIX_BYTES + msg.length);
      putGrpcPrefix(body, 0, msg.length);
      body.set(msg, GRPC_PREFIX_BYTES);
      if (this.span.isRecording()) this.span.setAttributes(ackSpanAttributes(ack));
      endSpan(this.span);
      this.answer(0, "", body);
    } catch (e) {
      this.fail(e);
    }
  }

  /** Frees the push and answers with the error's code; later input is discarded. */
  private fail(e: unknown): void {
    if (this.answered) return;
    this.session?.abort();
    this.session = undefined;
    const err = e instanceof KvError ? e : new KvError(Code.Internal, e instanceof Error ? e.message : String(e));
    endSpan(this.span, err);
    this.answer(err.code, err.message);
  }

  private answer(code: number, message: string, body?: Uint8Array): void {
    this.answered = true;
    const res = this.res;
    if (res.headersSent || res.destroyed) return;
    res.writeHead(200, { "content-type": this.contentType });
    if (body !== undefined) res.write(body);
    res.addTrailers(code === 0 ? { "grpc-status": "0" } : { "grpc-status": String(code), "grpc-message": encodeURIComponent(message) });
    res.end();
  }
}
