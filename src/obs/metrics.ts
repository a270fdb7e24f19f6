import { Counter, Gauge, Histogram, Registry } from "prom-client";

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** Every metric a tl-engine process exports; each process has its own registry. */
export function createMetrics() {
  const registry = new Registry();
  const registers = [registry];
  return {
    registry,
    ttft: new Histogram({
      name: "tl_time_to_first_token_seconds",
      help: "Time from request arrival to its first token",
      labelNames: ["served"],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    tpot: new Histogram({
      name: "tl_time_per_output_token_seconds",
      help: "Mean time between output tokens of a request",
      labelNames: ["served"],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers,
    }),
    requests: new Counter({
      name: "tl_requests_total",
      help: "Requests by how they were served and how they ended",
      labelNames: ["served", "outcome"],
      registers,
    }),
    kvBytes: new Counter({ name: "tl_kv_transfer_bytes_total", help: "KV envelope bytes pushed to decode engines", registers }),
    blocksSent: new Counter({ name: "tl_kv_blocks_sent_total", help: "KV blocks sent as envelopes", registers }),
    blocksDeduped: new Counter({ name: "tl_kv_blocks_deduped_total", help: "KV blocks the decode engine already held (not sent)", registers }),
    transferLatency: new Histogram({ name: "tl_kv_transfer_seconds", help: "HasBlocks plus PushKv, per transfer", buckets: LATENCY_BUCKETS, registers }),
    transferFailures: new Counter({ name: "tl_kv_transfer_failures_total", help: "Failed KV transfers by gRPC code", labelNames: ["code"], registers }),
    poolBlocks: new Gauge({ name: "tl_pool_blocks", help: "KV pool blocks by state", labelNames: ["state"], registers }),
    handlesPending: new Gauge({ name: "tl_kv_handles_pending", help: "Pushed handles not yet claimed or released", registers }),
    handlesExpired: new Counter({ name: "tl_kv_handles_expired_total", help: "Handles freed by their time to live", registers }),
    heartbeatMisses: new Gauge({ name: "tl_heartbeat_failures", help: "Consecutive failed heartbeats", registers }),
    registryWorkers: new Gauge({ name: "tl_registry_workers", help: "Live workers in the gateway's registry by role", labelNames: ["role"], registers }),
  };
}

export type Metrics = ReturnType<typeof createMetrics>;

export async function metricsResponse(m: Metrics): Promise<Response> {
  return new Response(await m.registry.metrics(), { headers: { "content-type": m.registry.contentType } });
}
