import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { envelopeBytes } from "../codec/index.ts";
import { KvTransfer, type KvChunk } from "../gen/tl/kv/v1/kv_pb.ts";
import { endSpan, extractHeaders, SpanKind, startSpan, type Attributes } from "../obs/index.ts";
import { ackSpanAttributes } from "./kv-chunk.ts";
import { KvError } from "./kv-error.ts";
import type { KvReceiver, PushSession } from "./kv-receiver.ts";

export interface KvServiceOptions {
  /** host:port of a binary data plane for this receiver, advertised in HasBlocksResponse; "" for none. */
  dataPlaneAddress?: string | (() => string);
}

/** tl.kv.v1.KvTransfer over a KvReceiver. */
export function kvService(receiver: KvReceiver, opts: KvServiceOptions = {}): ServiceImpl<typeof KvTransfer> {
  const dp = opts.dataPlaneAddress ?? "";
  const dataPlane = typeof dp === "function" ? dp : () => dp;
  return {
    hasBlocks(req) {
      try {
        return { present: receiver.hasBlocks(req.hashes, req.kvFormat), dataPlaneAddress: dataPlane() };
      } catch (e) {
        throw toConnectError(e);
      }
    },
    async pushKv(chunks: AsyncIterable<KvChunk>, ctx: HandlerContext) {
      let s: PushSession | undefined;
      // Child of P's kv.transfer CLIENT span, named by the `traceparent` metadata.
      const span = startSpan("kv.transfer", SpanKind.SERVER, extractHeaders(ctx.requestHeader), PUSH_ATTRS);
      try {
        for await (const c of chunks) {
          s ??= receiver.begin(c.handleId, c.total);
          s.accept(c);
        }
        // With Connect on Bun and Node a client that aborts mid-stream can end the
        // loop above normally; the abort shows only here (and in the count).
        if (ctx.signal.aborted) throw new KvError(Code.Canceled, `push ${s?.handleId ?? ""} cancelled by the client`);
        if (s === undefined) throw new KvError(Code.InvalidArgument, "empty push");
        const ack = s.finish();
        if (span.isRecording()) span.setAttributes(ackSpanAttributes(ack));
        endSpan(span);
        return ack;
      } catch (e) {
        s?.abort();
        endSpan(span, e);
        throw toConnectError(e);
      }
    },
    release(req) {
      return { released: receiver.release(req.handleId) };
    },
  };
}

/** The decode side's kv.transfer span of a gRPC PushKv, whichever handler serves it. */
export const PUSH_ATTRS: Attributes = { "tl.role": "decode", "tl.kv.transport": "grpc", "rpc.system": "grpc", "rpc.service": "tl.kv.v1.KvTransfer", "rpc.method": "PushKv" };

function toConnectError(e: unknown): ConnectError {
  if (e instanceof KvError) return new ConnectError(e.message, e.code as Code);
  return ConnectError.from(e, Code.Internal);
}

/**
 * Message limit: one envelope plus room for HasBlocks (8 bytes a hash: 64 KiB is
 * 8192 blocks, 131k tokens at B = 16) and the chunk's other fields.
 */
export function kvMessageLimit(receiver: KvReceiver): number {
  return envelopeBytes(receiver.pool.shape, 1) + 64 * 1024;
}
