import { Counter, Gauge, Histogram, Registry } from "prom-client";

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const REQUEST_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120];

export type MetricsRole = "gateway" | "prefill" | "decode" | "both";

const ALL: readonly MetricsRole[] = ["gateway", "prefill", "decode", "both"];
const ENGINES: readonly MetricsRole[] = ["prefill", "decode", "both"];
/** Roles that push KV blocks (and the gateway, which reports what its requests moved). */
const SENDERS: readonly MetricsRole[] = ["gateway", "prefill", "both"];
const RECEIVERS: readonly MetricsRole[] = ["decode", "both"];

/** The label the serving metrics carry, as vLLM's do, so dashboards can split by model. */
const MODEL = ["model_name"] as const;

/**
 * Every metric a tl-engine process exports, in its own registry, holding only the metrics
 * its role sets: a prefill engine exports no handle counts, a gateway no pool. A metric a
 * role never sets is still created (so callers need no checks) but never registered.
 *
 * The `tl_`-prefixed serving metrics follow vLLM's names (`vllm:prompt_tokens_total` is
 * `tl_prompt_tokens_total`, and so on) and carry `model_name`; the older ones keep their
 * names and labels.
 */
export function createMetrics(role: MetricsRole = "both") {
  const registry = new Registry();
  const to = (roles: readonly MetricsRole[]) => (roles.includes(role) ? [registry] : []);
  return {
    registry,
    role,
    /** The engine's preemption count as last exported (the counter moves by the difference). */
    seen: { preemptions: 0 },
    ttft: new Histogram({
      name: "tl_time_to_first_token_seconds",
      help: "Time from request arrival to its first token",
      labelNames: ["served"],
      buckets: LATENCY_BUCKETS,
      registers: to(ALL),
    }),
    tpot: new Histogram({
      name: "tl_time_per_output_token_seconds",
      help: "Mean time between output tokens of a request",
      labelNames: ["served"],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers: to(ALL),
    }),
    requests: new Counter({
      name: "tl_requests_total",
      help: "Requests by how they were served and how they ended",
      labelNames: ["served", "outcome"],
      registers: to(ALL),
    }),
    kvBytes: new Counter({ name: "tl_kv_transfer_bytes_total", help: "KV envelope bytes pushed to decode engines", registers: to(SENDERS) }),
    blocksSent: new Counter({ name: "tl_kv_blocks_sent_total", help: "KV blocks sent as envelopes", registers: to(SENDERS) }),
    blocksDeduped: new Counter({ name: "tl_kv_blocks_deduped_total", help: "KV blocks the decode engine already held (not sent)", registers: to(SENDERS) }),
    transferLatency: new Histogram({
      name: "tl_kv_transfer_seconds",
      help: "HasBlocks plus PushKv, per transfer",
      buckets: LATENCY_BUCKETS,
      registers: to(["prefill", "both"]),
    }),
    transferFailures: new Counter({
      name: "tl_kv_transfer_failures_total",
      help: "Failed KV transfers by gRPC code",
      labelNames: ["code"],
      registers: to(SENDERS),
    }),
    poolBlocks: new Gauge({ name: "tl_pool_blocks", help: "KV pool blocks by state", labelNames: ["state"], registers: to(ENGINES) }),
    handlesPending: new Gauge({ name: "tl_kv_handles_pending", help: "Pushed handles not yet claimed or released", registers: to(RECEIVERS) }),
    handlesExpired: new Counter({ name: "tl_kv_handles_expired_total", help: "Handles freed by their time to live", registers: to(RECEIVERS) }),
    heartbeatMisses: new Gauge({ name: "tl_heartbeat_failures", help: "Consecutive failed heartbeats", registers: to(ENGINES) }),
    kvEvents: new Counter({
      name: "tl_kv_events_total",
      help: "KV events the gateway took from engines' beats, by kind (stored, removed, snapshot: hashes of snapshot pieces)",
      labelNames: ["kind"],
      registers: to(["gateway"]),
    }),
    kvEventBytes: new Counter({ name: "tl_kv_event_bytes_total", help: "Encoded bytes of the KV events in engines' beats", registers: to(["gateway"]) }),
    kvSnapshotsAsked: new Counter({
      name: "tl_kv_event_snapshots_asked_total",
      help: "Beats answered with a request for a snapshot",
      registers: to(["gateway"]),
    }),
    prefixIndexBlocks: new Gauge({ name: "tl_prefix_index_blocks", help: "Blocks the prefix index holds from engines' reports", registers: to(["gateway"]) }),
    registryWorkers: new Gauge({
      name: "tl_registry_workers",
      help: "Live workers in the gateway's registry by role",
      labelNames: ["role"],
      registers: to(["gateway"]),
    }),
    // vLLM's serving metrics, by their names.
    promptTokens: new Counter({
      name: "tl_prompt_tokens_total",
      help: "Prompt tokens of the requests this process prefilled (the gateway: routed), prefix cache hits included",
      labelNames: MODEL,
      registers: to(ALL),
    }),
    generationTokens: new Counter({
      name: "tl_generation_tokens_total",
      help: "Tokens this process generated (the gateway: streamed to clients)",
      labelNames: MODEL,
      registers: to(ALL),
    }),
    e2eLatency: new Histogram({
      name: "tl_e2e_request_latency_seconds",
      help: "Time from a request's arrival to its end",
      labelNames: MODEL,
      buckets: REQUEST_BUCKETS,
      registers: to(ALL),
    }),
    queueTime: new Histogram({
      name: "tl_request_queue_time_seconds",
      help: "Time a request waited before it was first scheduled",
      labelNames: MODEL,
      buckets: LATENCY_BUCKETS,
      registers: to(ENGINES),
    }),
    running: new Gauge({ name: "tl_num_requests_running", help: "Requests in the engine's running batch", labelNames: MODEL, registers: to(ENGINES) }),
    waiting: new Gauge({ name: "tl_num_requests_waiting", help: "Requests waiting to be scheduled", labelNames: MODEL, registers: to(ENGINES) }),
    preemptions: new Counter({
      name: "tl_num_preemptions_total",
      help: "Running requests preempted (blocks given back, recomputed later) for want of KV blocks",
      labelNames: MODEL,
      registers: to(ENGINES),
    }),
    kvUsage: new Gauge({
      name: "tl_kv_cache_usage_perc",
      help: "Fraction of the KV pool's blocks held by requests and handles (0 to 1; cached blocks nobody holds count as free)",
      labelNames: MODEL,
      registers: to(ENGINES),
    }),
    prefixQueries: new Counter({
      name: "tl_prefix_cache_queries_total",
      help: "Prompt tokens looked up in the prefix cache",
      labelNames: MODEL,
      registers: to(ENGINES),
    }),
    prefixHits: new Counter({ name: "tl_prefix_cache_hits_total", help: "Prompt tokens found in the prefix cache", labelNames: MODEL, registers: to(ENGINES) }),
  };
}

export type Metrics = ReturnType<typeof createMetrics>;

/** One finished engine request, as the engine reports it (src/engine's Finish, by shape). */
export interface FinishedRequest {
  promptTokens: number;
  outputTokens: readonly number[];
  prefixHitTokens: number;
  resumed: boolean;
  queueMs: number | null;
  e2eMs: number;
}

/** Counts one finished request of an engine: a resumed one brought its prompt and first token with it. */
export function recordFinished(m: Metrics, model: string, f: FinishedRequest): void {
  const labels = { model_name: model };
  if (!f.resumed) {
    m.promptTokens.inc(labels, f.promptTokens);
    m.prefixQueries.inc(labels, f.promptTokens);
    m.prefixHits.inc(labels, f.prefixHitTokens);
  }
  const generated = f.outputTokens.length - (f.resumed ? 1 : 0);
  if (generated > 0) m.generationTokens.inc(labels, generated);
  m.e2eLatency.observe(labels, f.e2eMs / 1000);
  if (f.queueMs !== null) m.queueTime.observe(labels, f.queueMs / 1000);
}

/** Counts one request the gateway served, whichever engines ran it. */
export function recordServed(m: Metrics, model: string, r: { promptTokens: number; outputTokens: number; e2eMs: number }): void {
  const labels = { model_name: model };
  m.promptTokens.inc(labels, r.promptTokens);
  if (r.outputTokens > 0) m.generationTokens.inc(labels, r.outputTokens);
  m.e2eLatency.observe(labels, r.e2eMs / 1000);
}

/** An engine's live state, read at each scrape. */
export interface EngineState {
  running: number;
  waiting: number;
  /** Preemptions since start (the counter moves by the difference). */
  preemptions: number;
  usedBlocks: number;
  totalBlocks: number;
}

/** Sets the scrape-time gauges and advances the preemption counter to the engine's count. */
export function recordEngineState(m: Metrics, model: string, s: EngineState): void {
  const labels = { model_name: model };
  m.running.set(labels, s.running);
  m.waiting.set(labels, s.waiting);
  m.kvUsage.set(labels, s.totalBlocks === 0 ? 0 : s.usedBlocks / s.totalBlocks);
  // inc(0) still exports the sample, so a dashboard sees 0 rather than no series.
  m.preemptions.inc(labels, Math.max(0, s.preemptions - m.seen.preemptions));
  m.seen.preemptions = Math.max(m.seen.preemptions, s.preemptions);
}

export async function metricsResponse(m: Metrics): Promise<Response> {
  return new Response(await m.registry.metrics(), { headers: { "content-type": m.registry.contentType } });
}
