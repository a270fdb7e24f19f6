// The engine over a model thread that takes step N + 1 while step N runs (ModelPort.pipelineDepth): the
// same tokens, logprobs and finishes as over the model on the engine's own thread, whatever mix
// of requests shares the batch, and every block back in the pool at the end; and, with a gated
// stand-in, no block of the step posted ahead handed to anyone before that step settles.
import { afterAll, describe, expect, test } from "bun:test";
import {
  Engine,
  type EngineRequest,
  type ForwardDone,
  type Finish,
  type ModelPort,
  type RowSampling,
  type SamplingParams,
  type SeqChunk,
  type StepBatch,
  transformerPort,
  WorkerPort,
} from "../../src/engine/index.ts";
import { kvShapeOf, loadSyntheticModel, ModelWorker, SYNTHETIC_MODEL_NAME, Transformer } from "../../src/model/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Pcg32, sample } from "../../src/rng/index.ts";
import { FakeRunner } from "../support/fake-model.ts";

const m = loadSyntheticModel();
const local = new Transformer(m.cfg, m.weights);
const worker = await ModelWorker.start({ modelPath: SYNTHETIC_MODEL_NAME, threads: 1, maxSeqLen: 256 });
afterAll(() => {
  worker.close();
  local.close();
});

const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 24, stopTokenIds: [] };
const localRunner = transformerPort(local);
const workerRunner = new WorkerPort(worker);

interface Req extends Omit<EngineRequest, "onToken"> {
  /** Submitted once request 0 has emitted this many tokens (default: at once). */
  after?: number;
  /** Cancelled by its own onToken at its nth token. */
  cancelAt?: number;
}

interface Run {
  finishes: Finish[];
  emitted: unknown[][];
  steps: number;
  used: number;
}

/** Runs `reqs` through an engine over `model`; arrivals and cancels happen at fixed tokens, so two engines see the same. */
async function run(model: ModelPort, reqs: Req[], opts: { blocks?: number; maxModelLen?: number } = {}): Promise<Run> {
  const pool = new KvPool(kvShapeOf(m.cfg, 8), opts.blocks ?? 64, { shared: true });
  const engine = new Engine({ model, pool, maxModelLen: opts.maxModelLen ?? 256, maxBatchTokens: 64 });
  const emitted: unknown[][] = reqs.map(() => []);
  const done: Promise<Finish>[] = new Array(reqs.length);
  const submit = (i: number) => {
    const { after: _, cancelAt, ...r } = reqs[i]!;
    done[i] = engine.submit({
      ...r,
      onToken: (t, lp) => {
        emitted[i]!.push(lp ? [t, lp] : t);
        if (emitted[i]!.length === cancelAt) engine.cancel(r.requestId);
        if (i === 0) for (let j = 1; j < reqs.length; j++) if (reqs[j]!.after === emitted[0]!.length) submit(j);
      },
    });
  };
  for (let i = 0; i < reqs.length; i++) if (reqs[i]!.after === undefined) submit(i);
  const finishes: Finish[] = [];
  for (let i = 0; i < reqs.length; i++) {
    while (done[i] === undefined) await Bun.sleep(1);
    finishes.push({ ...(await done[i]!), e2eMs: 0, queueMs: 0 });
  }
  // A request that finished while a step posted ahead held it gives its blocks back as that step settles.
  for (let i = 0; i < 1000 && pool.used > 0; i++) await Bun.sleep(1);
  return { finishes, emitted, steps: engine.stats.steps, used: pool.used };
}

async function expectSame(reqs: Req[], opts: Parameters<typeof run>[2] = {}): Promise<{ want: Run; got: Run }> {
  const want = await run(localRunner, reqs, opts);
  const got = await run(workerRunner, reqs, opts);
  expect(got.finishes).toEqual(want.finishes);
  expect(got.emitted).toEqual(want.emitted);
  expect(want.used).toBe(0);
  expect(got.used).toBe(0);
  return { want, got };
}

const prompt = (n: number, k = 0) => Array.from({ length: n }, (_, i) => 32 + ((i * 7 + k * 13) % 90));

describe("engine over a pipelined model thread", () => {
  test("batch-1 greedy decode: the in-thread model's tokens, one forward per token", async () => {
    const { got } = await expectSame([{ requestId: "a", promptTokens: prompt(9), sampling: { ...greedy, maxTokens: 40 } }]);
    expect(got.finishes[0]!.outputTokens.length).toBe(40);
    expect(got.steps).toBe(40);
  });

  test("a steady decode wakes the engine's thread about once per two steps, and the model thread counts where its time went", async () => {
    const before = worker.counters;
    const { got } = await expectSame([{ requestId: "a", promptTokens: prompt(9), sampling: { ...greedy, maxTokens: 60 } }]);
    const after = worker.counters;
    expect(got.steps).toBe(60);
    const wakes = after.wakes - before.wakes;
    // Two steps settled a wake (a token reaches its client at most one step late), plus the
    // prefill's own and the few of the drain at the end; never more than there were notifies.
    expect(wakes).toBeLessThanOrEqual(60 / 2 + 4);
    expect(wakes).toBeLessThanOrEqual(after.notifies - before.notifies);
    expect(after.busyMs).toBeGreaterThan(before.busyMs);
    expect(after.notifyMs).toBeGreaterThanOrEqual(before.notifyMs);
    // (How often the model thread waited for a step depends on how busy the machine is: not asserted.)
    expect(after.idleWaits).toBeGreaterThanOrEqual(before.idleWaits);
  });

  test("seeded decodes sampled on the model thread: the in-thread model's tokens, one forward per token", async () => {
    const { got } = await expectSame([
      { requestId: "filtered", promptTokens: prompt(9, 8), sampling: { ...greedy, temperature: 0.8, topK: 40, topP: 0.9, seed: 11n, maxTokens: 30 } },
      { requestId: "hot", promptTokens: prompt(5, 9), sampling: { ...greedy, temperature: 1.3, seed: 12n, maxTokens: 30, topLogprobs: 1 } },
    ]);
    expect(got.finishes.map((f) => f.outputTokens.length)).toEqual([30, 30]);
    expect(got.steps).toBe(30);
  });

  test("a stop token mid-decode ends it at the same token; the steps posted ahead are dropped", async () => {
    const ref = await run(localRunner, [{ requestId: "a", promptTokens: prompt(5, 1), sampling: greedy }]);
    const stopAt = ref.finishes[0]!.outputTokens[6]!;
    const first = ref.finishes[0]!.outputTokens.indexOf(stopAt);
    const { want, got } = await expectSame([{ requestId: "a", promptTokens: prompt(5, 1), sampling: { ...greedy, stopTokenIds: [stopAt] } }]);
    expect(got.finishes[0]!.reason).toBe("stop");
    expect(got.finishes[0]!.outputTokens.length).toBe(first + 1);
    // The engine keeps the model thread three steps deep: the two posted past the stop are dropped.
    expect(got.steps).toBe(want.steps + 2);
  });

  test("greedy, seeded, logprobs, min_tokens, penalties and late arrivals in one batch", async () => {
    const ref = await run(localRunner, [{ requestId: "a", promptTokens: prompt(7, 2), sampling: greedy }]);
    const common = ref.finishes[0]!.outputTokens[2]!;
    await expectSame([
      { requestId: "greedy", promptTokens: prompt(7, 2), sampling: { ...greedy, maxTokens: 30 } },
      { requestId: "seeded", promptTokens: prompt(11, 3), sampling: { ...greedy, temperature: 0.9, topP: 0.95, seed: 7n } },
      { requestId: "logprobs", promptTokens: prompt(6, 4), sampling: { ...greedy, topLogprobs: 2 } },
      { requestId: "min-tokens", promptTokens: prompt(7, 2), sampling: { ...greedy, minTokens: 8, stopTokenIds: [common] } },
      { requestId: "penalty", promptTokens: prompt(9, 5), sampling: { ...greedy, presencePenalty: 1.5 } },
      { requestId: "late", promptTokens: prompt(20, 6), sampling: greedy, after: 5 },
      { requestId: "later", promptTokens: prompt(3, 7), sampling: { ...greedy, maxTokens: 4 }, after: 12 },
    ]);
  });

  test("a cancel mid-decode, a short pool's preemptions and the model length limit", async () => {
    const { want } = await expectSame(
      [
        { requestId: "a", promptTokens: prompt(10, 1), sampling: { ...greedy, maxTokens: 60 } },
        { requestId: "b", promptTokens: prompt(12, 2), sampling: { ...greedy, maxTokens: 60 }, cancelAt: 9 },
        { requestId: "c", promptTokens: prompt(14, 3), sampling: { ...greedy, maxTokens: 60 } },
        { requestId: "d", promptTokens: prompt(40, 4), sampling: { ...greedy, maxTokens: 60 }, after: 20 },
      ],
      { blocks: 14, maxModelLen: 64 },
    );
    expect(want.finishes.map((f) => f.reason)).toEqual(["length", "cancelled", "length", "length"]);
    expect(want.finishes.some((f) => f.preemptions > 0)).toBe(true);
  });

  test("a forward the model refuses fails its requests and frees their blocks; the next request runs", async () => {
    // The engine allows 2100 positions, the model 2048: the forward at position 2048 throws, and
    // the one posted ahead of it, which needs its token, fails too.
    const max = m.cfg.maxSeqLen;
    const long = prompt(max - 8);
    const failed = await run(workerRunner, [{ requestId: "a", promptTokens: long, sampling: { ...greedy, maxTokens: 20 } }], {
      maxModelLen: max + 50,
      blocks: 270,
    });
    expect(failed.finishes[0]!.reason).toBe("error");
    expect(failed.finishes[0]!.error).toMatch(new RegExp(`past maxSeqLen ${max}`));
    expect(failed.finishes[0]!.outputTokens.length).toBe(9);
    expect(failed.used).toBe(0);
    await expectSame([{ requestId: "b", promptTokens: prompt(4), sampling: greedy }]);
  });
});

/**
 * The fake model as a pipelined model thread runs it: forwards queue, each runs (K/V written,
 * logits and greedy tokens out) only when the test opens the gate, and a prevToken(r) chunk
 * token is the previous forward's row r token, resolved as it runs; a gate opened calls the
 * step's end at once.
 */
class GatedPipelined implements ModelPort {
  readonly inner = new FakeRunner();
  readonly vocabSize = this.inner.vocabSize;
  private readonly gates: (() => void)[] = [];
  private prev = new Int32Array(0);
  calls = 0;

  constructor(readonly pipelineDepth = 2) {}

  post(b: StepBatch, done: ForwardDone): void {
    this.enqueue(b.pool, b.chunks, b.logits, b.sampling, (s) => done(s, null));
  }

  /** Queues a forward behind the gate; `end` hears of its tokens as it runs. */
  protected enqueue(
    pool: KvPool,
    batch: readonly SeqChunk[],
    out: Float32Array,
    sampling: readonly (RowSampling | null)[],
    end: (s: Int32Array) => void,
  ): void {
    this.calls++;
    expect(this.gates.length).toBeLessThan(this.pipelineDepth);
    const copy = batch.map((c) => ({ blockTable: Array.from(c.blockTable), startPos: c.startPos, tokens: Array.from(c.tokens) }));
    // As a plan is written: the streams as they stand now.
    const rows = sampling.map((r) => r && { cfg: r.cfg, rng: r.rng && Pcg32.fromState(r.rng.state, r.rng.inc) });
    const logits = new Float32Array(batch.length * this.vocabSize);
    this.gates.push(() => {
      for (const c of copy) c.tokens = c.tokens.map((t) => (t < 0 ? this.prev[-1 - t]! : t));
      this.inner.forward(pool, copy, logits);
      out.set(logits);
      const V = this.vocabSize;
      const sampled = Int32Array.from(copy, (_, r) => (rows[r] ? sample(logits.subarray(r * V, (r + 1) * V), rows[r].cfg, rows[r].rng) : -1));
      this.prev = sampled;
      end(sampled);
    });
  }

  get waiting(): number {
    return this.gates.length;
  }

  open(): void {
    this.gates.shift()?.();
  }
}

/** GatedPipelined whose forward numbered `failAt` (from 1) ends failed. */
class GatedPosting extends GatedPipelined {
  failAt = 0;

  override post(b: StepBatch, done: ForwardDone): void {
    const n = this.calls + 1;
    this.enqueue(b.pool, b.chunks, b.logits, b.sampling, (s) => (n === this.failAt ? done(null, new Error(`forward ${n} failed`)) : done(s, null)));
  }

  /** Opens every gate posted so far, in one pass. */
  openAll(): void {
    for (let n = this.waiting; n > 0; n--) this.open();
  }
}

describe("engine over a gated pipelined model", () => {
  const shape = { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 };
  const sampling: SamplingParams = { ...greedy, maxTokens: 12 };

  test("the synchronous model's tokens, with the next step posted before each one settles", async () => {
    const want = await new Engine({ maxBatchTokens: 512, model: new FakeRunner(), pool: new KvPool(shape, 16), maxModelLen: 64 }).submit({
      requestId: "s",
      promptTokens: [5, 6, 7],
      sampling,
    });
    const runner = new GatedPipelined();
    const pool = new KvPool(shape, 16);
    const engine = new Engine({ maxBatchTokens: 512, model: runner, pool, maxModelLen: 64 });
    const got = engine.submit({ requestId: "a", promptTokens: [5, 6, 7], sampling });
    let ahead = 0;
    for (let settled = false; !settled; ) {
      void got.then(() => (settled = true));
      if (runner.waiting === 2) ahead++;
      if (runner.waiting > 0 && (runner.waiting === 2 || ahead > 0)) runner.open();
      await Bun.sleep(0);
    }
    expect((await got).outputTokens).toEqual(want.outputTokens);
    expect(ahead).toBe(11);
    expect(pool.used).toBe(0);
  });

  test("a request cancelled while steps ahead are posted keeps their blocks until the newest settles", async () => {
    const runner = new GatedPipelined(3);
    const pool = new KvPool(shape, 4);
    const engine = new Engine({ maxBatchTokens: 512, model: runner, pool, maxModelLen: 64 });
    let tokens = 0;
    const a = engine.submit({ requestId: "a", promptTokens: [1, 2, 3, 4, 5, 6, 7], sampling: { ...sampling, maxTokens: 4 }, onToken: () => tokens++ });
    // The prefill, and the decodes at positions 7 and 8 posted while it runs (8 takes a third block).
    while (runner.waiting < 3) await Bun.sleep(0);
    runner.open();
    while (tokens < 1) await Bun.sleep(0);
    // The decode at 9 is posted as the prefill settles; none after the next (max_tokens = 4).
    expect(runner.calls).toBe(4);
    runner.open();
    while (tokens < 2) await Bun.sleep(0);
    expect(runner.calls).toBe(4);
    expect(engine.cancel("a")).toBe(true);
    expect((await a).reason).toBe("cancelled");
    const held = [0, 1, 2];
    expect(held.map((id) => pool.refCount(id))).toEqual([1, 1, 1]);
    const payload = new Uint8Array(pool.blockBytes).fill(0x3c);
    const imported: number[] = [];
    for (let id = pool.importBlock(payload, shape.blockTokens); id >= 0; id = pool.importBlock(payload, shape.blockTokens)) imported.push(id);
    expect(imported).toEqual([3]);
    // The late steps write positions 8 and 9 into a's blocks, not the imported one, which a gets
    // back only when the newest step holding it settles.
    runner.open();
    await Bun.sleep(1);
    expect(held.map((id) => pool.refCount(id))).toEqual([1, 1, 1]);
    runner.open();
    while (pool.refCount(0) > 0) await Bun.sleep(1);
    expect(pool.payload(3).every((b) => b === 0x3c)).toBe(true);
    pool.releaseAll(imported);
    expect(pool.used).toBe(0);
    expect(runner.calls).toBe(4);
  });

  test("over a model's callback: the steps that ended by the time the engine runs settle in that one pass, with the synchronous model's tokens", async () => {
    const want = await new Engine({ maxBatchTokens: 512, model: new FakeRunner(), pool: new KvPool(shape, 16), maxModelLen: 64 }).submit({
      requestId: "s",
      promptTokens: [5, 6, 7],
      sampling,
    });
    const runner = new GatedPosting(3);
    const pool = new KvPool(shape, 16);
    const engine = new Engine({ maxBatchTokens: 512, model: runner, pool, maxModelLen: 64 });
    const tokens: number[] = [];
    const got = engine.submit({ requestId: "a", promptTokens: [5, 6, 7], sampling, onToken: (t) => tokens.push(t) });
    let pairs = 0;
    while (tokens.length < sampling.maxTokens) {
      await Bun.sleep(0);
      const before = tokens.length;
      const open = runner.waiting;
      runner.openAll();
      // No promise between the steps: each one's token is out before openAll returns.
      expect(tokens.length - before).toBe(Math.min(open, sampling.maxTokens - before));
      if (open >= 2) pairs++;
    }
    expect((await got).outputTokens).toEqual(want.outputTokens);
    expect(tokens).toEqual(want.outputTokens);
    expect(pairs).toBeGreaterThan(3);
    expect(pool.used).toBe(0);
  });

  test("over a model's callback: a forward that ends failed fails the request once the steps posted after it settle, and frees every block", async () => {
    const runner = new GatedPosting(3);
    runner.failAt = 4;
    const pool = new KvPool(shape, 16);
    const engine = new Engine({ maxBatchTokens: 512, model: runner, pool, maxModelLen: 64 });
    let tokens = 0;
    const got = engine.submit({ requestId: "a", promptTokens: [5, 6, 7], sampling, onToken: () => tokens++ });
    let settled = false;
    void got.then(() => (settled = true));
    // The prefill and two decodes ahead; each one settled posts the next.
    while (runner.waiting < 3) await Bun.sleep(0);
    runner.open();
    expect(tokens).toBe(1);
    expect(runner.calls).toBe(4);
    runner.open();
    runner.open();
    expect(tokens).toBe(3);
    expect(runner.calls).toBe(6);
    // The fourth fails: nothing more is posted or streamed, and the two after it are still in
    // flight, so nothing goes back before they settle.
    runner.open();
    await Bun.sleep(1);
    expect(tokens).toBe(3);
    expect(settled).toBe(false);
    expect(pool.used).toBeGreaterThan(0);
    runner.openAll();
    expect(runner.calls).toBe(6);
    const f = await got;
    expect(f.reason).toBe("error");
    expect(f.error).toBe("forward 4 failed");
    expect(pool.used).toBe(0);
    expect(runner.waiting).toBe(0);
  });
});
