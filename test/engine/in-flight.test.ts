// The engine with a model on another thread: post returns at once, the engine keeps serving
// meanwhile, and no block of the in-flight batch is given to anyone else until it settles.
import { describe, expect, test } from "bun:test";
import { Engine, type ForwardDone, type ModelPort, type SamplingParams, type StepBatch, type WorkerPort } from "../../src/engine/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { FakeRunner } from "../support/fake-model.ts";

const shape = { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 };
const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 6, stopTokenIds: [] };

/**
 * The fake model as a model thread would run it: post returns at once, and the K/V writes
 * and logits happen only when the test opens the gate (as a worker writes the slab late).
 */
class GatedRunner implements ModelPort {
  readonly inner = new FakeRunner();
  readonly vocabSize = this.inner.vocabSize;
  private gates: (() => void)[] = [];
  inFlight = 0;
  maxInFlight = 0;
  calls = 0;
  failWith: string | null = null;

  post(b: StepBatch, done: ForwardDone): void {
    this.calls++;
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    // The engine may change block tables once post returns; a worker has its own copy of the plan.
    const copy = b.chunks.map((c) => ({ blockTable: [...Array.from(c.blockTable)], startPos: c.startPos, tokens: [...Array.from(c.tokens)] }));
    const { pool, logits } = b;
    this.gates.push(() => {
      this.inFlight--;
      if (this.failWith !== null) return done(null, new Error(this.failWith));
      this.inner.forward(pool, copy, logits);
      done(null, null);
    });
  }

  get waiting(): number {
    return this.gates.length;
  }

  /** Lets the oldest forward finish. */
  open(): void {
    this.gates.shift()?.();
  }

  async untilCalled(n: number): Promise<void> {
    while (this.calls < n) await Bun.sleep(1);
  }
}

function setup(blocks = 16) {
  const pool = new KvPool(shape, blocks);
  const runner = new GatedRunner();
  const engine = new Engine({ model: runner, pool, maxBatchTokens: 64, maxModelLen: 64 });
  return { pool, runner, engine };
}

/** Runs gated forwards until `done` settles. */
async function pump(runner: GatedRunner, done: Promise<unknown>): Promise<void> {
  let settled = false;
  void done.finally(() => (settled = true));
  while (!settled) {
    if (runner.waiting > 0) runner.open();
    await Bun.sleep(0);
  }
}

describe("engine with an asynchronous model", () => {
  test("gives the same tokens as the synchronous model, one forward at a time", async () => {
    const prompts = [
      [5, 6, 7],
      [1, 2, 3, 4, 5, 6, 7, 8, 9],
    ];
    const syncPool = new KvPool(shape, 16);
    const sync = new Engine({ model: new FakeRunner(), pool: syncPool, maxBatchTokens: 64, maxModelLen: 64 });
    const want = await Promise.all(prompts.map((p, i) => sync.submit({ requestId: `s${i}`, promptTokens: p, sampling: greedy })));
    const { pool, runner, engine } = setup();
    const all = Promise.all(prompts.map((p, i) => engine.submit({ requestId: `r${i}`, promptTokens: p, sampling: greedy })));
    await pump(runner, all);
    expect((await all).map((f) => f.outputTokens)).toEqual(want.map((f) => f.outputTokens));
    expect(runner.maxInFlight).toBe(1);
    expect(pool.used).toBe(0);
  });

  test("preemption under a short pool gives the synchronous model's tokens", async () => {
    const prompts = [
      [3, 1, 4, 1, 5],
      [9, 2, 6, 5, 3, 5],
      [8, 9, 7, 9],
    ];
    const long = { ...greedy, maxTokens: 10 };
    const run = async (model: ModelPort, pump?: (p: Promise<unknown>) => Promise<void>) => {
      const pool = new KvPool(shape, 8);
      const engine = new Engine({ model, pool, maxBatchTokens: 64, maxModelLen: 64 });
      const all = Promise.all(prompts.map((p, i) => engine.submit({ requestId: `r${i}`, promptTokens: p, sampling: long })));
      if (pump) await pump(all);
      const done = await all;
      expect(pool.used).toBe(0);
      return { tokens: done.map((f) => f.outputTokens), preemptions: engine.stats.preemptions };
    };
    const want = await run(new FakeRunner());
    expect(want.preemptions).toBeGreaterThan(0);
    const runner = new GatedRunner();
    expect(await run(runner, (p) => pump(runner, p))).toEqual(want);
  });

  test("a request cancelled mid-forward keeps its blocks until the forward ends", async () => {
    const { pool, runner, engine } = setup(4);
    const a = engine.submit({ requestId: "a", promptTokens: [1, 2, 3, 4, 5, 6, 7], sampling: greedy });
    await runner.untilCalled(1);
    const held = [0, 1]; // a fresh pool hands out 0, 1, ...
    expect(held.map((id) => pool.refCount(id))).toEqual([1, 1]);
    expect(engine.cancel("a")).toBe(true);
    expect((await a).reason).toBe("cancelled");

    // Meanwhile another request's blocks arrive (a KV import) and take every block there is.
    const payload = new Uint8Array(pool.blockBytes).fill(0x3c);
    const imported: number[] = [];
    for (let id = pool.importBlock(payload, shape.blockTokens); id >= 0; id = pool.importBlock(payload, shape.blockTokens)) imported.push(id);
    expect(imported.some((id) => held.includes(id))).toBe(false);
    expect(held.map((id) => pool.refCount(id))).toEqual([1, 1]);

    // The late forward writes a's K/V: none of it may land in the imported blocks.
    runner.open();
    while (pool.refCount(0) > 0) await Bun.sleep(1);
    for (const id of imported) expect(pool.payload(id).every((b) => b === 0x3c)).toBe(true);
    expect(pool.refCount(1)).toBe(0);
    pool.releaseAll(imported);
    expect(pool.used).toBe(0);
    expect(engine.inFlight).toBe(0);
  });

  test("a request that finishes while another's forward runs starts no second forward", async () => {
    const { pool, runner, engine } = setup();
    const a = engine.submit({ requestId: "a", promptTokens: [1, 2, 3], sampling: greedy });
    await runner.untilCalled(1);
    const b = engine.submit({ requestId: "b", promptTokens: [4, 5, 6], sampling: greedy });
    await Bun.sleep(5);
    expect(runner.calls).toBe(1);
    await pump(runner, Promise.all([a, b]));
    expect(runner.maxInFlight).toBe(1);
    expect(pool.used).toBe(0);
  });

  test("a failed forward finishes every request with its error and frees every block", async () => {
    const { pool, runner, engine } = setup();
    const a = engine.submit({ requestId: "a", promptTokens: [1, 2, 3, 4, 5], sampling: greedy });
    await runner.untilCalled(1);
    const b = engine.submit({ requestId: "b", promptTokens: [9, 9], sampling: greedy });
    runner.failWith = "model worker died: boom";
    runner.open();
    const [fa, fb] = await Promise.all([a, b]);
    expect([fa.reason, fb.reason]).toEqual(["error", "error"]);
    expect(fa.error).toBe("model worker died: boom");
    expect(pool.used).toBe(0);
    expect(engine.inFlight).toBe(0);
  });
});

describe("an engine whose model thread dies", () => {
  test("fails the requests it was running, frees their blocks, drains, and fails new ones at once", async () => {
    const { startEngineNode } = await import("../../src/cli/engine-node.ts");
    const node = await startEngineNode({ role: "both", modelPath: "tl-synthetic-4l", threads: 1, blockTokens: 16, numBlocks: 64, maxModelLen: 512 });
    try {
      expect(node.model.sharedSlab).toBe(true);
      let tokens = 0;
      const running = node.engine.submit({
        requestId: "long",
        promptTokens: [72, 101, 108, 108, 111],
        sampling: { ...greedy, maxTokens: 400, ignoreEos: true },
        onToken: () => tokens++,
      });
      while (tokens < 3) await Bun.sleep(1);
      // As a crash would: the model thread goes away without a word.
      ((node.model.runner as WorkerPort).worker as unknown as { worker: Worker }).worker.terminate();
      const f = await running;
      expect(f.reason).toBe("error");
      expect(f.error).toMatch(/model worker died/);
      expect(node.pool.used).toBe(0);
      expect(node.engine.isDraining).toBe(true);
      const late = await node.engine.submit({ requestId: "late", promptTokens: [1, 2], sampling: greedy });
      expect(late.reason).toBe("error");
      expect(node.pool.used).toBe(0);
    } finally {
      await node.shutdown();
    }
  });
});
