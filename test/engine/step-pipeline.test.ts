// The StepPipeline on its own, over a model port the test ends by hand: steps settle and are
// postprocessed in the order posted whatever order their forwards end in; blocks given back
// while a step holds them go back only when it settles; a failure settles the steps posted
// after it before the run rejects, with the first error.
import { describe, expect, test } from "bun:test";
import { type KvBlocks, KvCacheManager } from "../../src/engine/kv-cache-manager.ts";
import type { ForwardDone, ModelPort, StepBatch } from "../../src/engine/model-port.ts";
import type { Sequence } from "../../src/engine/sequence.ts";
import type { Step } from "../../src/engine/step.ts";
import { StepPipeline } from "../../src/engine/step-pipeline.ts";
import { KvPool } from "../../src/pool/index.ts";

const shape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };

/** A model whose steps end only when the test says so. */
class HandModel implements ModelPort {
  readonly vocabSize = 4;
  readonly pipelineDepth = 3;
  readonly posted: { batch: StepBatch; done: ForwardDone }[] = [];
  throwOnPost: Error | null = null;
  post(batch: StepBatch, done: ForwardDone): void {
    if (this.throwOnPost) throw this.throwOnPost;
    this.posted.push({ batch, done });
  }
  end(i: number, error: Error | null = null): void {
    this.posted[i]!.done(error ? null : new Int32Array([-1]), error);
  }
}

interface Rig {
  pool: KvPool;
  kv: KvCacheManager;
  model: HandModel;
  pipe: StepPipeline;
  /** Steps postprocessed, by the number planAhead gave them (0 = the first). */
  order: number[];
  table: KvBlocks;
  first: Step;
}

/** A pipeline of depth 3 whose planAhead offers `ahead` more one-row steps over one table of 2 blocks. */
function rig(ahead: number, postprocess?: (n: number) => void): Rig {
  const pool = new KvPool(shape, 8);
  const kv = new KvCacheManager(pool);
  const model = new HandModel();
  const order: number[] = [];
  const table = kv.allocate(kv.open(), 4)!;
  const seq = { kv: table } as unknown as Sequence;
  const numbers = new Map<Step, number>();
  let planned = 0;
  const pipe: StepPipeline = new StepPipeline({
    model,
    pool,
    kv,
    depth: 3,
    stats: { steps: 0 },
    planAhead: () => {
      if (planned >= ahead) return null;
      const s = pipe.take(1);
      s.pick(seq, 1);
      s.seal();
      numbers.set(s, ++planned);
      return s;
    },
    postprocess: (s) => {
      const n = numbers.get(s)!;
      order.push(n);
      postprocess?.(n);
    },
  });
  const first = pipe.take(0);
  first.pick(seq, 1);
  first.seal();
  numbers.set(first, 0);
  return { pool, kv, model, pipe, order, table, first };
}

describe("StepPipeline", () => {
  test("steps ended last to first are postprocessed first to last, and the run ends after the last", async () => {
    const r = rig(2);
    let ended = false;
    const run = r.pipe.run(r.first).then(() => {
      ended = true;
    });
    expect(r.model.posted.length).toBe(3);
    r.model.end(2);
    r.model.end(1);
    expect(r.order).toEqual([]);
    r.model.end(0);
    await run;
    expect(r.order).toEqual([0, 1, 2]);
    expect(ended).toBe(true);
  });

  test("blocks given back while a step holds them go back when the newest holder settles", async () => {
    const r = rig(1);
    const free = r.pool.free;
    const run = r.pipe.run(r.first);
    r.kv.free(r.table);
    expect(r.pool.free).toBe(free);
    r.model.end(0);
    // Step 1 still holds the table.
    expect(r.pool.free).toBe(free);
    r.model.end(1);
    await run;
    expect(r.pool.free).toBe(free + 2);
  });

  test("a failed step lets the steps posted after it settle, then the run rejects with the first error", async () => {
    const r = rig(2);
    const free = r.pool.free;
    const run = r.pipe.run(r.first);
    let rejected: unknown = null;
    run.catch((e) => {
      rejected = e;
    });
    r.kv.free(r.table);
    r.model.end(0, new Error("first"));
    r.model.end(1, new Error("second"));
    await Promise.resolve();
    expect(rejected).toBeNull();
    expect(r.pool.free).toBe(free);
    r.model.end(2);
    await expect(run).rejects.toThrow("first");
    expect(r.order).toEqual([]);
    expect(r.pool.free).toBe(free + 2);
  });

  test("a postprocess that throws fails the run, and no later step is postprocessed", async () => {
    const r = rig(2, (n) => {
      if (n === 0) throw new Error("postprocess");
    });
    const run = r.pipe.run(r.first);
    for (let i = 0; i < 3; i++) r.model.end(i);
    await expect(run).rejects.toThrow("postprocess");
    expect(r.order).toEqual([0]);
  });

  test("a post that throws is a failed step: the run rejects with its error and the hold is gone", async () => {
    const r = rig(0);
    const free = r.pool.free;
    r.model.throwOnPost = new Error("post");
    await expect(r.pipe.run(r.first)).rejects.toThrow("post");
    r.kv.free(r.table);
    expect(r.pool.free).toBe(free + 2);
  });
});
