import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { loadModel, type ServedModel } from "../../src/cli/engine-node.ts";
import { generate } from "../../src/cli/generate.ts";
import { parseArgs } from "../../src/cli/options.ts";
import { DEFAULT_MODEL_NAME, defaultModelDir } from "../../src/model/load/default-model.ts";
import { SYNTHETIC_MODEL_NAME } from "../../src/model/index.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";
import { REPO } from "./procs.ts";

// What tools/train/eval.py computed from the shipped weights with its own PyTorch forward.
interface Greedy {
  prompt: string;
  prompt_ids: number[];
  completion_ids: number[];
  completion_text: string;
}
const expected = JSON.parse(readFileSync(join(REPO, "models", DEFAULT_MODEL_NAME, "expected.json"), "utf8")) as { greedy: Greedy[] };

let model: ServedModel;
let cluster: TestCluster;

beforeAll(async () => {
  model = await loadModel({});
  cluster = await startTestCluster({
    prefill: 1,
    decode: 1,
    node: { model, blockTokens: 16 },
    gateway: { tokenizer: model.tokenizer, modelName: model.name, maxModelLen: model.maxSeqLen },
  });
  await cluster.waitForWorkers(2);
});

afterAll(async () => {
  await cluster?.stop();
});

test("default model is the shipped folder", async () => {
  expect(defaultModelDir()).toBe(join(REPO, "models", DEFAULT_MODEL_NAME));
  expect(model.name).toBe(DEFAULT_MODEL_NAME);
  expect(model.stats?.dtype).toBe("f16");
  expect(model.tokenizer.vocabSize).toBe(1024);
  // The synthetic model stays reachable by name.
  expect((await loadModel({ modelPath: SYNTHETIC_MODEL_NAME })).name).toBe(SYNTHETIC_MODEL_NAME);
  expect(expected.greedy).toHaveLength(2);
});

test("default model generate gives the stored greedy continuations", async () => {
  for (const g of expected.greedy) {
    expect(model.tokenizer.encode(g.prompt)).toEqual(g.prompt_ids);
    let out = "";
    let writes = 0;
    const { config, rest } = parseArgs(["--prompt", g.prompt, "--max-tokens", String(g.completion_ids.length)]);
    await generate(config, rest, (s) => {
      out += s;
      writes++;
    });
    expect(out.startsWith(`${g.prompt}${g.completion_text}\n[${DEFAULT_MODEL_NAME}] `)).toBe(true);
    // The prompt, the last line and the speeds aside, a write per wake of the engine, not per
    // token: the model thread's steady decode settles its steps in pairs.
    expect(writes - 3).toBeLessThan(g.completion_ids.length * 0.75);
  }
});

/** A greedy completion of g's prompt from `http`: its served header, ids and text. */
async function complete(http: string, g: Greedy) {
  const res = await fetch(`http://${http}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: DEFAULT_MODEL_NAME, prompt: g.prompt, max_tokens: g.completion_ids.length, temperature: 0, return_token_ids: true }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { choices: { text: string; token_ids: number[] }[] };
  return { served: res.headers.get("x-tl-served"), ids: body.choices[0]!.token_ids, text: body.choices[0]!.text };
}

test("default model gateway gives the stored greedy tokens disaggregated and colocated", async () => {
  for (const g of expected.greedy) {
    const want = { ids: g.completion_ids, text: g.completion_text };
    expect(await complete(cluster.gateway.httpAddress, g)).toEqual({ served: "disaggregated", ...want });
    // One engine serving the whole request (no hand-off header) gives the same ids.
    expect(await complete(cluster.prefill[0]!.httpAddress, g)).toEqual({ served: null, ...want });
  }
});
