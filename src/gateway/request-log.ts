import { type CompletionParams, TokenQueue } from "../http/index.ts";
import { endSpan, log, type Metrics, recordServed, type Span } from "../obs/index.ts";

/** How one request was served, as reported in headers, the last chunk and /metrics. */
export interface Served {
  /** decode-local: prefilled on the decode engine itself (conditional disaggregation), no transfer. */
  served: "disaggregated" | "disaggregated-retried" | "decode-local" | "colocated-fallback";
  prefillWorker: string;
  decodeWorker: string;
  blocksSent: number;
  blocksDeduped: number;
  payloadBytes: number;
}

/** The response headers that say how a request was served. */
export function servedHeaders(s: Served, routing: boolean): Record<string, string> {
  return {
    "x-tl-served": s.served,
    ...(routing ? { "x-tl-prefill-worker": s.prefillWorker, "x-tl-decode-worker": s.decodeWorker } : {}),
    "x-tl-blocks-sent": String(s.blocksSent),
    "x-tl-blocks-deduped": String(s.blocksDeduped),
    "x-tl-payload-bytes": String(s.payloadBytes),
  };
}

/** The last chunk's `tl` field. */
export function servedExtra(s: Served, routing: boolean) {
  return {
    tl: {
      served: s.served,
      ...(routing ? { prefill_worker: s.prefillWorker, decode_worker: s.decodeWorker } : {}),
      blocks_sent: s.blocksSent,
      blocks_deduped: s.blocksDeduped,
      payload_bytes: s.payloadBytes,
    },
  };
}

/** A request being followed to its last token: when it arrived, its id and params, its SERVER span. */
export interface FollowedRequest {
  requestId: string;
  /** The client's x-request-id, logged beside the internal id. */
  clientRequestId: string | undefined;
  /** the served model's name, the `model_name` label of its metrics */
  modelName: string;
  params: CompletionParams;
  served: Served;
  /** performance.now() at arrival */
  arrived: number;
  span: Span;
}

/**
 * The request log: relays each choice's queue into one it returns, counting tokens, and
 * when every stream ended writes the request's log line, its metrics (outcome, TTFT of
 * a colocated request, TPOT) and its span's last attributes, then calls `onEnd`.
 */
export function followRequest(metrics: Metrics, queues: TokenQueue[], r: FollowedRequest, onEnd: () => void): TokenQueue[] {
  const s = r.served;
  let n = 0;
  let firstAt = 0;
  const relay = async (q: TokenQueue, counted: TokenQueue) => {
    let i = 0;
    for await (const t of q) {
      if (n++ === 0) {
        firstAt = performance.now();
        // A hand-off observed its TTFT when token 1 came back from P; a single-engine request does here.
        if (s.served === "colocated-fallback" || s.served === "decode-local") metrics.ttft.observe({ served: s.served }, (firstAt - r.arrived) / 1000);
      }
      counted.push(t, q.logprobsAt(i++));
    }
    // The detail (engine addresses, handle ids) is logged with the request; the client hears its id and the kind.
    counted.close(
      q.end.reason === "error"
        ? { reason: "error", error: `request ${r.requestId}: generation failed on the ${s.served === "colocated-fallback" ? "engine" : "decode engine"}` }
        : q.end,
    );
  };
  const counted = queues.map(() => new TokenQueue());
  void (async () => {
    await Promise.all(queues.map((q, i) => relay(q, counted[i]!)));
    onEnd();
    const end = queues.find((q) => q.end.reason === "error")?.end ?? queues.find((q) => q.end.reason === "cancelled")?.end ?? queues[0]!.end;
    const outcome = end.reason === "error" ? "error" : end.reason === "cancelled" ? "cancelled" : "ok";
    metrics.requests.inc({ served: s.served, outcome });
    recordServed(metrics, r.modelName, { promptTokens: r.params.promptTokens.length, outputTokens: n, e2eMs: performance.now() - r.arrived });
    if (n > queues.length) metrics.tpot.observe({ served: s.served }, (performance.now() - firstAt) / 1000 / (n - queues.length));
    log.info("request", {
      request_id: r.requestId,
      ...(r.clientRequestId !== undefined ? { client_request_id: r.clientRequestId } : {}),
      served: s.served,
      prefill_worker: s.prefillWorker,
      decode_worker: s.decodeWorker,
      prompt_tokens: r.params.promptTokens.length,
      output_tokens: n,
      choices: queues.length,
      outcome,
      error: end.error,
      duration_ms: Math.round(performance.now() - r.arrived),
      blocks_sent: s.blocksSent,
      blocks_deduped: s.blocksDeduped,
      payload_bytes: s.payloadBytes,
    });
    if (r.span.isRecording()) {
      r.span.setAttributes({
        "tl.served": s.served,
        "tl.prefill_worker": s.prefillWorker,
        "tl.decode_worker": s.decodeWorker,
        "tl.output_tokens": n,
        "tl.outcome": outcome,
      });
    }
    endSpan(r.span, end.reason === "error" ? end.error : undefined);
  })();
  return counted;
}

/** The metrics of a finished hand-off: what moved, and the time to the first token the gateway emits now. */
export function recordHandoff(metrics: Metrics, s: Served, ttftSeconds: number): void {
  metrics.blocksSent.inc(s.blocksSent);
  metrics.blocksDeduped.inc(s.blocksDeduped);
  metrics.kvBytes.inc(s.payloadBytes);
  metrics.ttft.observe({ served: s.served }, ttftSeconds);
}
