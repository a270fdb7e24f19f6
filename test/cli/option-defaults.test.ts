// SPECS (src/cli/options.ts) is the one place a default is written. The engine a caller starts
// without options runs with exactly what --help says, and so does the gateway; no layer keeps a
// default of its own.
import { afterAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { ENGINE_DEFAULTS, type EngineConfig, GATEWAY_CONFIG_DEFAULTS, type GatewayConfig, helpText, SPECS } from "../../src/cli/options.ts";
import { gatewayTuning } from "../../src/cli/run-engine.ts";
import { startGateway } from "../../src/gateway/index.ts";
import { fakeServedModel } from "../support/nodes.ts";
import { REPO } from "./procs.ts";

const nodes: EngineNode[] = [];
afterAll(async () => {
  for (const n of nodes) await n.shutdown();
});

/** The default --help prints for `[section] key`, parsed back out of its line. */
function helpDefault(section: string, key: string): string {
  const lines = helpText()
    .split("\n")
    .filter((l) => l.trimStart().startsWith(`[${section}] ${key} `));
  expect(lines.length, `one help line for [${section}] ${key}`).toBe(1);
  const all = [...lines[0]!.matchAll(/\(default: (.*?)\)$/g)];
  expect(all.length).toBe(1);
  return all[0]![1]!;
}
const helpNumber = (section: string, key: string) => JSON.parse(helpDefault(section, key)) as number;

test("help states each default once", () => {
  for (const s of SPECS) {
    const line = helpText()
      .split("\n")
      .find((l) => l.trimStart().startsWith(`[${s.section}] ${s.key} `))!;
    // "(default: all cores) (default: 2)" was printed for threads.
    expect({ key: s.key, defaults: line.split("(default:").length - 1 }).toEqual({ key: s.key, defaults: 1 });
  }
  expect(helpDefault("engine", "threads")).toMatch(/^all cores \(\d+ here\)$/);
  // max_model_len is the model's context unless given (it said 2048 while tl-kjv-small serves 256).
  expect(helpDefault("engine", "max_model_len")).toContain("the model's context");
  // The figure it gives for the embedded model is that model's.
  const cfg = JSON.parse(readFileSync(join(REPO, "models", "tl-kjv-small", "config.json"), "utf8")) as { max_position_embeddings: number };
  expect(helpDefault("engine", "max_model_len")).toContain(`${cfg.max_position_embeddings} for the embedded tl-kjv-small`);
});

test("engine started without options runs the help defaults", async () => {
  const model = fakeServedModel();
  const gw = await startGateway({ ...gatewayTuning(), tokenizer: model.tokenizer, modelName: "fake", maxModelLen: 512 });
  try {
    const n = await startEngineNode({ role: "both", model, gatewayRegistry: gw.registryAddress });
    nodes.push(n);
    const want = {
      blockTokens: helpNumber("engine", "block_tokens"),
      numBlocks: helpNumber("engine", "num_blocks"),
      maxModelLen: model.maxSeqLen,
      maxBatchTokens: helpNumber("engine", "max_batch_tokens"),
      handleTtlS: helpNumber("engine", "handle_ttl_s"),
      pushIdleTimeoutMs: helpNumber("engine", "push_idle_timeout_ms"),
      heartbeatIntervalMs: helpNumber("engine", "heartbeat_interval_ms"),
      heartbeatTimeoutMs: helpNumber("engine", "heartbeat_timeout_ms"),
      maxRequestBytes: helpNumber("engine", "max_request_bytes"),
    };
    expect(n.effective).toEqual(want);
    // ...and the objects it built run with them (num_blocks was 2048 in --help, 1024 here).
    expect(n.pool.total).toBe(want.numBlocks);
    expect(n.pool.shape.blockTokens).toBe(want.blockTokens);
    expect(n.engine.maxModelLen).toBe(want.maxModelLen);
    expect(n.receiver!.ttlMs).toBe(want.handleTtlS * 1000);
    expect(n.receiver!.pushIdleTimeoutMs).toBe(want.pushIdleTimeoutMs);
    // The gateway's wiring takes the [gateway] defaults: its registry's interval is --help's.
    expect(gw.registry.intervalMs).toBe(helpNumber("gateway", "heartbeat_interval_ms"));
    expect(gatewayTuning().disaggMinUncachedTokens).toBe(helpNumber("gateway", "disagg_min_uncached_tokens"));
    // The HTTP listener's bounds too (they had a table of their own in src/http).
    expect(gatewayTuning().frontDoor).toEqual({
      maxRequestBytes: helpNumber("gateway", "max_request_bytes"),
      headersTimeoutS: helpNumber("gateway", "http_headers_timeout_s"),
      bodyTimeoutS: helpNumber("gateway", "http_body_timeout_s"),
      maxConnections: helpNumber("gateway", "http_max_connections"),
      healthReserve: helpNumber("gateway", "http_health_reserve"),
    });
  } finally {
    await gw.stop();
  }
});

test("typed configs come from specs", () => {
  // EngineConfig and GatewayConfig are mapped from SPECS: each key typed by its option's kind.
  const blocks: number = ENGINE_DEFAULTS.num_blocks;
  const insecure: boolean = GATEWAY_CONFIG_DEFAULTS.insecure;
  const keys: readonly string[] = ENGINE_DEFAULTS.api_key;
  // @ts-expect-error: no such option, so no such field (npm test's typecheck fails if the type lost its keys).
  const none: unknown = ENGINE_DEFAULTS.no_such_option;
  // @ts-expect-error: num_blocks is a number.
  const wrong: EngineConfig["num_blocks"] = "2048";
  const g: Partial<GatewayConfig> = { disagg_min_uncached_tokens: 0 };
  expect([blocks, insecure, keys, none, wrong, g.disagg_min_uncached_tokens]).toEqual([2048, false, [], undefined, "2048", 0]);
  const engineKeys = SPECS.filter((s) => s.section === "engine").map((s) => s.key);
  expect(Object.keys(ENGINE_DEFAULTS).sort()).toEqual([...engineKeys].sort());
});
