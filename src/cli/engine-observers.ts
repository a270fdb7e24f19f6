import { Code } from "@connectrpc/connect";
import { createMetrics, log, metricsResponse, recordEngineState, recordFinished, type MetricsRole } from "../obs/index.ts";
import type { EngineNode, EngineNodeOptions } from "./engine-node.ts";

/**
 * What an engine process records of its work: a log line and the metrics of every request,
 * hand-off and expired handle, and /metrics, read from the node once it runs. `observe` is
 * given the node when it has started (the observers are called only after that).
 */
export function engineObservers(role: "prefill" | "decode" | "both") {
  const metrics = createMetrics(role satisfies MetricsRole);
  let node: EngineNode | null = null;
  const options: Pick<EngineNodeOptions, "onRequestEnd" | "onHandleExpired" | "onTransfer" | "extraRoutes"> = {
    onRequestEnd: (r) => {
      const served = r.resumed ? "resumed" : "local";
      metrics.requests.inc({ served, outcome: r.reason });
      if (r.ttftMs !== null) metrics.ttft.observe({ served }, r.ttftMs / 1000);
      if (r.ttftMs !== null && r.outputTokens > 1) metrics.tpot.observe({ served }, (r.durationMs - r.ttftMs) / 1000 / (r.outputTokens - 1));
      log.info("request", {
        request_id: r.requestId,
        ...(r.clientRequestId !== undefined ? { client_request_id: r.clientRequestId } : {}),
        role,
        path: served,
        prompt_tokens: r.promptTokens,
        output_tokens: r.outputTokens,
        prefix_hit_tokens: r.prefixHitTokens,
        finish: r.reason,
        ttft_ms: r.ttftMs,
        duration_ms: Math.round(r.durationMs),
      });
    },
    onHandleExpired: (handle) => {
      metrics.handlesExpired.inc();
      log.warn("kv handle expired unclaimed", { handle });
    },
    onTransfer: ({ stats, code, ms, target }) => {
      metrics.transferLatency.observe(ms / 1000);
      if (stats) {
        metrics.kvBytes.inc(stats.payloadBytes);
        metrics.blocksSent.inc(stats.blocksSent);
        metrics.blocksDeduped.inc(stats.blocksDeduped);
      } else metrics.transferFailures.inc({ code: code === null ? "UNKNOWN" : (Code[code] ?? String(code)) });
      log.info("kv.transfer", { target, ok: stats !== null, code: code === null ? null : Code[code], ms: Math.round(ms), ...stats });
    },
    extraRoutes: async (req, url) => {
      if (req.method !== "GET" || url.pathname !== "/metrics" || node === null) return null;
      const { pool, engine } = node;
      metrics.poolBlocks.set({ state: "used" }, pool.used);
      metrics.poolBlocks.set({ state: "cached" }, pool.cached);
      metrics.poolBlocks.set({ state: "free" }, pool.free);
      metrics.handlesPending.set(node.receiver?.pending() ?? 0);
      metrics.heartbeatMisses.set(node.heartbeat?.failures ?? 0);
      recordEngineState(metrics, node.model.name, {
        running: engine.runningCount,
        waiting: engine.queueDepth,
        preemptions: engine.stats.preemptions,
        usedBlocks: pool.used,
        totalBlocks: pool.total,
      });
      return metricsResponse(metrics);
    },
  };
  return {
    options,
    /** From now on /metrics reads this node; every request it runs, whichever door it came in by (HTTP, Prefill, a resume), is counted. */
    observe(started: EngineNode): void {
      node = started;
      started.engine.onFinish((f) => recordFinished(metrics, started.model.name, f));
    },
  };
}
