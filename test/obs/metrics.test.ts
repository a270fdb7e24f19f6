import { afterAll, beforeAll, expect, test } from "bun:test";
import { parseArgs } from "../../src/cli/options.ts";
import { runEngine, runGateway } from "../../src/cli/run-engine.ts";
import { roleArgs } from "../../src/cli/spawn-role.ts";
import type { EngineNode } from "../../src/cli/engine-node.ts";
import type { Gateway } from "../../src/gateway/index.ts";
import { Engine, type Finish } from "../../src/engine/index.ts";
import { createMetrics, recordEngineState, recordFinished, type MetricsRole } from "../../src/obs/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { FakeRunner } from "../support/fake-model.ts";

// What operators chart, by vLLM's names with tl_: each set where its role does the work,
// and absent where the role never does.

const SERVING = ["tl_prompt_tokens_total", "tl_generation_tokens_total", "tl_e2e_request_latency_seconds"];
const ENGINE = [
  "tl_request_queue_time_seconds",
  "tl_num_requests_running",
  "tl_num_requests_waiting",
  "tl_num_preemptions_total",
  "tl_kv_cache_usage_perc",
  "tl_prefix_cache_queries_total",
  "tl_prefix_cache_hits_total",
  "tl_pool_blocks",
  "tl_heartbeat_failures",
];
const SENDER = ["tl_kv_transfer_bytes_total", "tl_kv_blocks_sent_total", "tl_kv_blocks_deduped_total", "tl_kv_transfer_failures_total"];
const COMMON = ["tl_time_to_first_token_seconds", "tl_time_per_output_token_seconds", "tl_requests_total", ...SERVING];
const EXPECTED: Record<MetricsRole, string[]> = {
  gateway: [
    ...COMMON,
    ...SENDER,
    "tl_registry_workers",
    "tl_kv_events_total",
    "tl_kv_event_bytes_total",
    "tl_kv_event_snapshots_asked_total",
    "tl_prefix_index_blocks",
  ],
  prefill: [...COMMON, ...ENGINE, ...SENDER, "tl_kv_transfer_seconds"],
  decode: [...COMMON, ...ENGINE, "tl_kv_handles_pending", "tl_kv_handles_expired_total"],
  both: [...COMMON, ...ENGINE, ...SENDER, "tl_kv_transfer_seconds", "tl_kv_handles_pending", "tl_kv_handles_expired_total"],
};

test("metrics each role registers only what it sets", async () => {
  for (const role of Object.keys(EXPECTED) as MetricsRole[]) {
    const names = (await createMetrics(role).registry.getMetricsAsJSON()).map((m) => m.name);
    expect({ role, names: names.sort() }).toEqual({ role, names: [...EXPECTED[role]].sort() });
  }
});

test("metrics preemptions follow the engine count", async () => {
  const m = createMetrics("decode");
  const state = { running: 2, waiting: 3, preemptions: 0, usedBlocks: 6, totalBlocks: 8 };
  recordEngineState(m, "tiny", state);
  recordEngineState(m, "tiny", { ...state, preemptions: 3 });
  recordEngineState(m, "tiny", { ...state, preemptions: 5 });
  const text = await m.registry.metrics();
  expect(sample(text, "tl_num_preemptions_total", 'model_name="tiny"')).toBe(5);
  expect(sample(text, "tl_num_requests_running", 'model_name="tiny"')).toBe(2);
  expect(sample(text, "tl_num_requests_waiting", 'model_name="tiny"')).toBe(3);
  expect(sample(text, "tl_kv_cache_usage_perc", 'model_name="tiny"')).toBe(0.75);
});

/** The value of the sample `name{...labels...} value` whose labels include `labels`; null when there is none. */
function sample(text: string, name: string, labels: string): number | null {
  for (const line of text.split("\n")) {
    const m = /^(\w+)\{([^}]*)\} (\S+)$/.exec(line);
    if (m && m[1] === name && m[2]!.split(",").includes(labels)) return Number(m[3]);
  }
  return null;
}

test("metrics queue time is the wait before first scheduling", async () => {
  // One running request fills the batch (maxRunning 1): the second waits until it ends.
  let clock = 1000;
  const pool = new KvPool({ blockTokens: 4, nLayers: 1, nKvHeads: 1, headDim: 4 }, 32);
  const engine = new Engine({ model: new FakeRunner(), pool, maxBatchTokens: 64, maxRunning: 1, maxModelLen: 64, now: () => clock });
  const seen: Finish[] = [];
  engine.onFinish((f) => seen.push(f));
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 3, stopTokenIds: [] };
  const first = engine.submit({ requestId: "a", promptTokens: [1, 2, 3], sampling, onToken: () => (clock += 10) });
  const second = engine.submit({ requestId: "b", promptTokens: [4, 5, 6], sampling, onToken: () => (clock += 10) });
  const [a, b] = await Promise.all([first, second]);
  expect(a.queueMs).toBe(0);
  // b waited while a produced its 3 tokens (10 ms each on this clock).
  expect(b.queueMs).toBe(30);
  expect(b.e2eMs).toBe(60);
  expect(seen.map((f) => f.e2eMs)).toEqual([30, 60]);
  const m = createMetrics("decode");
  for (const f of seen) recordFinished(m, "tiny", f);
  const text = await m.registry.metrics();
  expect(sample(text, "tl_request_queue_time_seconds_sum", 'model_name="tiny"')).toBeCloseTo(0.03, 9);
  expect(sample(text, "tl_e2e_request_latency_seconds_sum", 'model_name="tiny"')).toBeCloseTo(0.09, 9);
  expect(sample(text, "tl_generation_tokens_total", 'model_name="tiny"')).toBe(6);
  expect(sample(text, "tl_prompt_tokens_total", 'model_name="tiny"')).toBe(6);
});

let gateway: Gateway;
let prefill: EngineNode;
let decode: EngineNode;
const scrape = async (http: string) => (await fetch(`http://${http}/metrics`)).text();

beforeAll(async () => {
  const beat = ["--heartbeat-interval-ms", "100"];
  // Every request crosses the hand-off, so the disaggregated families are set.
  gateway = await runGateway(parseArgs(roleArgs("gateway", [...beat, "--disagg-min-uncached-tokens", "0"])).config);
  const registry = ["--gateway-registry", gateway.registryAddress];
  prefill = await runEngine(parseArgs(roleArgs("prefill", ["--worker-id", "p0", ...beat, ...registry])).config);
  decode = await runEngine(parseArgs(roleArgs("decode", ["--worker-id", "d0", ...beat, ...registry])).config);
  for (const end = Date.now() + 10_000; gateway.registry.live().length < 2; ) {
    if (Date.now() > end) throw new Error("engines never registered");
    await Bun.sleep(20);
  }
});

afterAll(async () => {
  await Promise.all([prefill?.shutdown(), decode?.shutdown()]);
  await gateway?.stop();
});

test("metrics serving families are set on every role that serves", async () => {
  const res = await fetch(`http://${gateway.httpAddress}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "The quick brown fox jumps over the lazy dog, again and again.", max_tokens: 12, temperature: 0 }),
  });
  expect(res.status).toBe(200);
  expect(res.headers.get("x-tl-served")).toBe("disaggregated");
  const body = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
  const { prompt_tokens: promptTokens, completion_tokens: outputTokens } = body.usage;
  expect(outputTokens).toBe(12);
  const model = `model_name="${prefill.model.name}"`;

  const [g, p, d] = await Promise.all([scrape(gateway.httpAddress), scrape(prefill.httpAddress), scrape(decode.httpAddress)]);
  // The gateway counts what its clients asked for and got.
  expect(sample(g, "tl_prompt_tokens_total", model)).toBe(promptTokens);
  expect(sample(g, "tl_generation_tokens_total", model)).toBe(outputTokens);
  expect(sample(g, "tl_e2e_request_latency_seconds_count", model)).toBe(1);
  // P prefilled the prompt and sampled token 1; D generated the rest from the hand-off.
  expect(sample(p, "tl_prompt_tokens_total", model)).toBe(promptTokens);
  expect(sample(p, "tl_prefix_cache_queries_total", model)).toBe(promptTokens);
  expect(sample(p, "tl_prefix_cache_hits_total", model)).toBe(0);
  expect(sample(p, "tl_generation_tokens_total", model)).toBe(1);
  expect(sample(d, "tl_prompt_tokens_total", model)).toBeNull();
  expect(sample(d, "tl_generation_tokens_total", model)).toBe(outputTokens - 1);
  for (const engine of [p, d]) {
    expect(sample(engine, "tl_e2e_request_latency_seconds_count", model)).toBe(1);
    expect(sample(engine, "tl_request_queue_time_seconds_count", model)).toBe(1);
    expect(sample(engine, "tl_num_requests_running", model)).toBe(0);
    expect(sample(engine, "tl_num_requests_waiting", model)).toBe(0);
    expect(sample(engine, "tl_num_preemptions_total", model)).toBe(0);
    const usage = sample(engine, "tl_kv_cache_usage_perc", model)!;
    expect(usage).toBeGreaterThanOrEqual(0);
    expect(usage).toBeLessThanOrEqual(1);
  }
  // What a role never does, it never exports.
  expect(g).not.toContain("tl_pool_blocks");
  expect(g).not.toContain("tl_num_requests_running");
  expect(p).not.toContain("tl_kv_handles_pending");
  expect(p).not.toContain("tl_registry_workers");
  expect(d).not.toContain("tl_kv_transfer_seconds");
  expect(d).not.toContain("tl_kv_blocks_sent_total");
});

test("metrics kv usage counts what a request holds", async () => {
  // A handle pushed and never claimed holds blocks on D: the usage ratio shows it.
  const before = sample(await scrape(decode.httpAddress), "tl_kv_cache_usage_perc", `model_name="${decode.model.name}"`)!;
  const pool = decode.pool;
  const held = pool.allocate(4)!;
  try {
    const during = sample(await scrape(decode.httpAddress), "tl_kv_cache_usage_perc", `model_name="${decode.model.name}"`)!;
    expect(during - before).toBeCloseTo(4 / pool.total, 9);
  } finally {
    pool.releaseAll(held);
  }
});
