// One request whose logits cannot be sampled (a penalty that overflows to +Infinity, every token
// masked, a NaN from the model) ends alone with an error and its blocks back; the other rows of
// its batch get the very tokens they get without it, on the engine's thread and on a model
// thread that samples rows itself.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine, type Finish, type ModelPort, type SamplingParams, transformerPort, WorkerPort } from "../../src/engine/index.ts";
import { kvShapeOf, loadSyntheticModel, ModelWorker, SYNTHETIC_MODEL_NAME, Transformer } from "../../src/model/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { writeHfFolder } from "../support/model-writers.ts";

const m = loadSyntheticModel();
const V = m.cfg.vocabSize;
const local = new Transformer(m.cfg, m.weights);
const localRunner = transformerPort(local);
const worker = await ModelWorker.start({ modelPath: SYNTHETIC_MODEL_NAME, threads: 1, maxSeqLen: 256 });
const workerRunner = new WorkerPort(worker);
const dir = mkdtempSync(join(tmpdir(), "tl-poisoned-"));
let nanWorker: ModelWorker | undefined;

afterAll(() => {
  worker.close();
  nanWorker?.close();
  local.close();
  rmSync(dir, { recursive: true, force: true });
});

const seeded = (seed: number): SamplingParams => ({ temperature: 0.8, topP: 0.95, topK: 0, seed: BigInt(seed), maxTokens: 30, stopTokenIds: [] });
const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 30, stopTokenIds: [] };
const prompt = (n: number, k: number) => Array.from({ length: n }, (_, i) => 32 + ((i * 7 + k * 13) % 90));

interface Req {
  id: string;
  prompt: number[];
  sampling: SamplingParams;
}
const healthy: Req[] = [
  { id: "a", prompt: prompt(9, 1), sampling: seeded(1) },
  { id: "b", prompt: prompt(5, 2), sampling: greedy },
  { id: "c", prompt: prompt(12, 3), sampling: seeded(3) },
  { id: "d", prompt: prompt(7, 4), sampling: { ...seeded(4), topK: 20 } },
  { id: "e", prompt: prompt(6, 5), sampling: { ...seeded(5), presencePenalty: 0.5, logitBias: new Map([[65, 2]]) } },
];

/** Submits every request in one go (one batch), then one more after; returns the finishes by id and the pool's used blocks at the end. */
async function run(model: ModelPort, reqs: Req[]): Promise<{ by: Map<string, Finish & { emitted: number[] }>; used: number; after: Finish }> {
  const pool = new KvPool(kvShapeOf(m.cfg, 8), 128, { shared: true });
  const engine = new Engine({ model, pool, maxModelLen: 256, maxBatchTokens: 128 });
  const by = new Map<string, Finish & { emitted: number[] }>();
  await Promise.all(
    reqs.map(async (r) => {
      const emitted: number[] = [];
      const f = await engine.submit({ requestId: r.id, promptTokens: r.prompt, sampling: r.sampling, onToken: (t) => emitted.push(t) });
      by.set(r.id, { ...f, e2eMs: 0, queueMs: 0, emitted });
    }),
  );
  // The engine serves on: a request after the failure runs to its end.
  const after = await engine.submit({ requestId: "after", promptTokens: prompt(4, 9), sampling: { ...greedy, maxTokens: 5 } });
  for (let i = 0; i < 1000 && pool.used > 0; i++) await Bun.sleep(1);
  return { by, used: pool.used, after };
}

async function expectIsolated(model: ModelPort, poisoned: Req[], kind: "request" | "model", base = healthy): Promise<void> {
  const want = await run(model, base);
  // The poisoned ones in the middle of the batch, so rows after them shift.
  const got = await run(model, [...base.slice(0, 2), ...poisoned, ...base.slice(2)]);
  for (const r of base) {
    const g = got.by.get(r.id)!;
    expect({ id: r.id, reason: g.reason, tokens: g.outputTokens, emitted: g.emitted }).toEqual({
      id: r.id,
      reason: "length",
      tokens: want.by.get(r.id)!.outputTokens,
      emitted: want.by.get(r.id)!.emitted,
    });
  }
  for (const p of poisoned) {
    const f = got.by.get(p.id)!;
    expect({ reason: f.reason, kind: f.errorKind }).toEqual({ reason: "error", kind });
    if (p.id === "nan-decode") expect(f.emitted.length).toBe(3);
    expect(f.error).toContain("no token can be sampled");
  }
  expect(got.after.reason).toBe("length");
  expect([want.used, got.used]).toEqual([0, 0]);
}

// The same model with one token's embedding all NaN: a sequence that feeds it gets NaN logits
// from the model itself, sampled on the model thread. The token is one a greedy decode of
// NAN_PROMPT emits third and no healthy request (nor the one after) ever feeds, so the row fails
// in a decode step, with the steps posted ahead of it naming its token.
const { poison, nanPrompt } = await (async () => {
  const used = new Set<number>();
  const base = await run(localRunner, healthy);
  for (const r of healthy) for (const t of [...r.prompt, ...base.by.get(r.id)!.outputTokens]) used.add(t);
  for (const t of [...prompt(4, 9), ...base.after.outputTokens]) used.add(t);
  for (let k = 20; k < 200; k++) {
    const p = prompt(6, k);
    const out = (await run(localRunner, [{ id: "x", prompt: p, sampling: greedy }])).by.get("x")!.outputTokens;
    const t = out[2]!;
    if (!used.has(t) && !p.includes(t) && !out.slice(0, 2).includes(t)) return { poison: t, nanPrompt: p };
  }
  throw new Error("no token to poison");
})();
const nanWeights = { ...m.weights, tokenEmbedding: Float32Array.from(m.weights.tokenEmbedding as Float32Array) };
nanWeights.tokenEmbedding.fill(NaN, poison * m.cfg.dim, (poison + 1) * m.cfg.dim);
writeHfFolder(dir, m.cfg, nanWeights);
nanWorker = await ModelWorker.start({ modelPath: dir, threads: 1, maxSeqLen: 256 });

describe("one sequence's bad logits end it alone", () => {
  // Not reachable over HTTP or EngineControl (both refuse below 0.01): the engine's own guard.
  const overflow: Req = { id: "poisoned", prompt: prompt(8, 7), sampling: { ...seeded(9), repetitionPenalty: 1e-300 } };
  const allMasked: Req = {
    id: "masked",
    prompt: prompt(8, 8),
    sampling: { ...seeded(10), minTokens: 3, stopTokenIds: Array.from({ length: V }, (_, i) => i) },
  };
  const overflowGreedy: Req = { id: "poisoned-greedy", prompt: prompt(3, 6), sampling: { ...greedy, repetitionPenalty: 1e-300 } };

  test("a repetition penalty that overflows, and a mask of every token: engine's thread", async () => {
    await expectIsolated(localRunner, [overflow, overflowGreedy], "request");
    await expectIsolated(localRunner, [allMasked], "request");
  });

  test("the same over a pipelined model thread (the others sampled there)", async () => {
    await expectIsolated(workerRunner, [overflow, overflowGreedy], "request");
    await expectIsolated(workerRunner, [allMasked], "request");
  });

  test("NaN logits from the model, sampled on the model thread: that row alone fails", async () => {
    const nan: Req = { id: "nan", prompt: [...prompt(5, 11), poison], sampling: seeded(12) };
    const nanDecode: Req = { id: "nan-decode", prompt: nanPrompt, sampling: greedy };
    await expectIsolated(new WorkerPort(nanWorker!), [nan, nanDecode], "model");
    // No row with logits processing (sampled on the engine's thread): the model thread samples
    // every row, and steps are posted ahead naming the failed row's token.
    await expectIsolated(new WorkerPort(nanWorker!), [nanDecode], "model", healthy.slice(0, 4));
  });
});
