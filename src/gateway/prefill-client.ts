import { create } from "@bufbuild/protobuf";
import { KV_FORMAT } from "../codec/index.ts";
import { samplingToProto } from "../control/index.ts";
import { EngineControl, type KvHandle, PrefillRequestSchema } from "../gen/tl/engine/v1/engine_pb.ts";
import { type CompletionParams, samplingOf } from "../http/index.ts";
import { type Attributes, endSpan, type Span, SpanKind, startSpan, traceHeaders } from "../obs/index.ts";
import { grpcClient } from "../rpc/index.ts";
import type { ClientTls } from "../rpc/tls-client.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import type { WorkerView } from "./worker-registry.ts";

const PREFILL_ATTRS: Attributes = { "tl.role": "gateway", "rpc.system": "grpc", "rpc.service": "tl.engine.v1.EngineControl", "rpc.method": "Prefill" };

/** `p`, or a rejection as soon as `signal` aborts (p itself goes on). */
export function untilAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

/** The gateway's side of EngineControl.Prefill: ask P to prefill and push to D, or to stop. */
export class PrefillClient {
  /** Over mTLS, P's certificate must name a prefill (or both) engine. */
  private readonly tls: { tls?: ClientTls };

  constructor(
    private readonly timeoutMs: number,
    tls: TlsSource | null = null,
    /** This replica's id (PrefillRequest.gateway_id): D binds the handle to it. */
    private readonly gatewayId = "",
  ) {
    this.tls = tls ? { tls: { source: tls, expect: ["prefill", "both"] } } : {};
  }

  /** Prefill on `p` pushing to `d`, under a CLIENT span of `parent`; resolves with the handle D holds. */
  async prefill(p: WorkerView, d: WorkerView, params: CompletionParams, requestId: string, signal: AbortSignal, parent: Span): Promise<KvHandle> {
    const control = grpcClient(EngineControl, p.status.grpcAddress, { timeoutMs: this.timeoutMs, ...this.tls });
    const span = startSpan("tl.engine.v1.EngineControl/Prefill", SpanKind.CLIENT, parent, PREFILL_ATTRS);
    if (span.isRecording())
      span.setAttributes({ "server.address": p.status.grpcAddress, "tl.worker_id": p.status.workerId, "tl.decode_target": d.status.kvAddress });
    try {
      const handle = await control.prefill(
        create(PrefillRequestSchema, {
          requestId,
          promptTokens: params.promptTokens,
          sampling: samplingToProto(samplingOf(params)),
          decodeTarget: d.status.kvAddress,
          kvFormat: KV_FORMAT,
          n: params.n,
          gatewayId: this.gatewayId,
          ...(params.constraint ? { structured: { kind: params.constraint.kind, source: params.constraint.source } } : {}),
        }),
        { signal, headers: traceHeaders(span) },
      );
      if (span.isRecording())
        span.setAttributes({
          "tl.kv.blocks_sent": handle.blocksSent,
          "tl.kv.blocks_deduped": handle.blocksDeduped,
          "tl.kv.payload_bytes": Number(handle.payloadBytes),
        });
      endSpan(span);
      return handle;
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  /**
   * The client left during Prefill: stop P's work, and hand whatever handle the call still
   * yields to `release`. Resolves once the call has answered and `release` (if due) was called.
   */
  abandon(call: Promise<KvHandle>, p: WorkerView, requestId: string, release: (handleId: string) => void): Promise<void> {
    grpcClient(EngineControl, p.status.grpcAddress, { timeoutMs: 5000, ...this.tls })
      .cancel({ requestId })
      .catch(() => {});
    return call.then(
      (h) => {
        if (!h.finished) release(h.handleId);
      },
      () => {},
    );
  }
}
