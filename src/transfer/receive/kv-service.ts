import { callerOf } from "../../rpc/peer-gate.ts";
import { peerKey } from "../../rpc/peer-identity.ts";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { Code } from "../../rpc/status.ts";
import { envelopeBytes } from "../../codec/index.ts";
import type { KvTransfer, KvChunk } from "../../gen/tl/kv/v1/kv_pb.ts";
import { extractHeaders } from "../../obs/index.ts";
import { KvError } from "../wire/index.ts";
import type { KvReceiver } from "./kv-receiver.ts";
import { GRPC_PUSH_ATTRS, PushDriver, toKvError } from "./push-driver.ts";

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
        throw toKvError(e);
      }
    },
    async pushKv(chunks: AsyncIterable<KvChunk>, ctx: HandlerContext) {
      const push = new PushDriver(receiver);
      const caller = callerOf(ctx);
      push.peer = caller === undefined ? "" : peerKey(caller);
      // Child of P's kv.transfer CLIENT span, named by the `traceparent` metadata.
      push.trace(extractHeaders(ctx.requestHeader), GRPC_PUSH_ATTRS);
      let handleId = "";
      try {
        for await (const c of chunks) {
          if (handleId === "") handleId = c.handleId;
          push.accept(c);
        }
        // With Connect on Bun and Node a client that aborts mid-stream can end the
        // loop above normally; the abort shows only here (and in the count).
        if (ctx.signal.aborted) throw new KvError(Code.Canceled, `push ${handleId} cancelled by the client`);
        return push.finish();
      } catch (e) {
        throw push.fail(e);
      }
    },
    release(req, ctx) {
      // A prefill engine gives back only what it pushed; the gateway (which saw the handle in KvHandle) any.
      const caller = callerOf(ctx);
      return { released: receiver.release(req.handleId, caller === undefined || caller.role === "gateway" ? undefined : peerKey(caller)) };
    },
  };
}

/**
 * Message limit: one envelope plus room for HasBlocks (8 bytes a hash: 64 KiB is
 * 8192 blocks, 131k tokens at B = 16) and the chunk's other fields.
 */
export function kvMessageLimit(receiver: KvReceiver): number {
  return envelopeBytes(receiver.pool.shape, 1) + 64 * 1024;
}
