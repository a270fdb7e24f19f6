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
import { KvAckSchema, KvChunkSchema } from "../../gen/tl/kv/v1/kv_pb.ts";
import { extractHeaders } from "../../obs/index.ts";
import { Code } from "../../rpc/status.ts";
import { GRPC_PREFIX_BYTES, grpcMessageLength, putGrpcPrefix, sendGrpcStatus } from "../../rpc/grpc-wire.ts";
import { KvError, Reassembler } from "../wire/index.ts";
import type { KvReceiver } from "./kv-receiver.ts";
import { peerIdentity, peerKey, type PeerCertSource } from "../../rpc/peer-identity.ts";
import { GRPC_PUSH_ATTRS, PushDriver } from "./push-driver.ts";

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
  private readonly push: PushDriver;
  /** answered (ACK or error): what still arrives is discarded */
  private answered = false;
  /** prefix and message together, split across DATA chunks or not */
  private readonly messages = new Reassembler(64 * 1024);

  constructor(
    rx: KvReceiver,
    private readonly maxBytes: number,
    private readonly req: http2.Http2ServerRequest,
    private readonly res: http2.Http2ServerResponse,
    private readonly contentType: string,
  ) {
    this.push = new PushDriver(rx);
    const id = peerIdentity(req.socket as unknown as PeerCertSource);
    this.push.peer = id === null ? "" : peerKey(id);
    // Child of P's kv.transfer CLIENT span, named by the `traceparent` metadata.
    const headers = new Headers();
    for (const k of ["traceparent", "tracestate"]) {
      const v = req.headers[k];
      if (typeof v === "string") headers.set(k, v);
    }
    this.push.trace(extractHeaders(headers), GRPC_PUSH_ATTRS);
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
      this.push.fail(new KvError(Code.Canceled, "push stream closed before it ended"));
    };
    this.req.on("aborted", gone);
    this.req.on("error", gone);
    this.res.on("close", () => {
      if (!this.req.readableEnded) gone();
    });
  }

  private onData(buf: Uint8Array): void {
    const r = this.messages;
    let off = 0;
    try {
      while (off < buf.length && !this.answered) {
        const len = r.head(buf, off, GRPC_PREFIX_BYTES, grpcMessageLength);
        off += r.consumed;
        if (len < 0) return;
        this.check(r.headBuf[r.headAt]!, len);
        const m = r.take(buf, off, GRPC_PREFIX_BYTES + len);
        off += r.consumed;
        if (m === null) return;
        this.message(m.subarray(GRPC_PREFIX_BYTES));
      }
    } catch (e) {
      this.fail(e);
    }
  }

  private check(flags: number, len: number): void {
    if (flags & 1) throw new KvError(Code.Internal, "compressed message without a grpc-encoding");
    if (len > this.maxBytes) throw new KvError(Code.ResourceExhausted, `message size ${len} is larger than configured readMaxBytes ${this.maxBytes}`);
  }

  private message(bytes: Uint8Array): void {
    let c;
    try {
      c = fromBinary(KvChunkSchema, bytes);
    } catch (e) {
      throw new KvError(Code.InvalidArgument, `KvChunk message: ${e instanceof Error ? e.message : String(e)}`);
    }
    this.push.accept(c);
  }

  private onEnd(): void {
    if (this.answered) return;
    try {
      if (this.messages.pending > 0) throw new KvError(Code.InvalidArgument, "stream ended inside a message");
      // As with Connect on Bun, a client that resets mid-stream can look like a clean
      // end here: finish() refuses a push short of its `total` chunks.
      const ack = this.push.finish();
      const msg = toBinary(KvAckSchema, create(KvAckSchema, ack));
      const body = new Uint8Array(GRPC_PREFIX_BYTES + msg.length);
      putGrpcPrefix(body, 0, msg.length);
      body.set(msg, GRPC_PREFIX_BYTES);
      this.answer(0, "", body);
    } catch (e) {
      this.fail(e);
    }
  }

  /** Frees the push and answers with the error's code; later input is discarded. */
  private fail(e: unknown): void {
    if (this.answered) return;
    const err = this.push.fail(e);
    this.answer(err.code, err.message);
  }

  private answer(code: number, message: string, body?: Uint8Array): void {
    this.answered = true;
    sendGrpcStatus(this.res, this.contentType, code, message, body);
  }
}
