// A steady decode allocates nothing per token in the engine's loop: the batch, chunk and row
// sampling records the model is handed are the same objects step after step (a ring of step
// records as deep as the pipeline, one chunk and one row sampling per sequence), and the
// tokens are still those of the synchronous model.
import { describe, expect, test } from "bun:test";
import {
  Engine,
  type ForwardDone,
  type ModelPort,
  type RowSampling,
  type SamplingParams,
  type SeqChunk,
  type StepBatch,
  transformerPort,
} from "../../src/engine/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Pcg32, sample } from "../../src/rng/index.ts";
import { FakeRunner } from "../support/fake-model.ts";

const shape = { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 };
const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 40, stopTokenIds: [] };
const seeded: SamplingParams = { ...greedy, temperature: 0.9, topK: 20, seed: 5n };

/** What one forward was handed: the records themselves, not copies. */
interface Seen {
  batch: readonly SeqChunk[];
  chunks: SeqChunk[];
  sampling: readonly (RowSampling | null)[];
  rows: (RowSampling | null)[];
  /** The rows' streams as they were at the call (a row sampling's rng is refilled each step). */
  rngs: (Pcg32 | null)[];
}

/**
 * A pipelined model that runs each forward as it is posted (the one before ran already, so a
 * prevToken(r) is known) and settles it on a later turn; it keeps the identities it was handed,
 * and the callbacks.
 */
class EagerPipelined implements ModelPort {
  readonly inner = new FakeRunner();
  readonly vocabSize = this.inner.vocabSize;
  readonly pipelineDepth = 4;
  readonly seen: Seen[] = [];
  readonly dones: ForwardDone[] = [];
  private prev = new Int32Array(0);

  post(b: StepBatch, done: ForwardDone): void {
    this.dones.push(done);
    const sampled = this.forward(b.pool, b.chunks, b.logits, b.sampling);
    void Bun.sleep(0).then(() => done(sampled, null));
  }

  private forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array, sampling: readonly (RowSampling | null)[]): Int32Array {
    this.seen.push({ batch, chunks: [...batch], sampling, rows: [...sampling], rngs: sampling.map((r) => r?.rng ?? null) });
    const copy = batch.map((c) => ({
      blockTable: Array.from(c.blockTable),
      startPos: c.startPos,
      tokens: Array.from(c.tokens, (t) => (t < 0 ? this.prev[-1 - t]! : t)),
    }));
    this.inner.forward(pool, copy, out);
    const V = this.vocabSize;
    const rng = (r: RowSampling) => r.rng && Pcg32.fromState(r.rng.state, r.rng.inc);
    this.prev = Int32Array.from(copy, (_, i) => (sampling[i] ? sample(out.subarray(i * V, (i + 1) * V), sampling[i].cfg, rng(sampling[i])) : -1));
    return this.prev;
  }
}

/** Distinct objects among xs. */
const distinct = (xs: readonly unknown[]) => new Set(xs).size;

async function decode(model: ModelPort, sampling: SamplingParams[]): Promise<number[][]> {
  const engine = new Engine({ maxBatchTokens: 512, model, pool: new KvPool(shape, 64), maxModelLen: 128 });
  const done = sampling.map((s, i) => engine.submit({ requestId: `r${i}`, promptTokens: [3 + i, 9, 4, 1, 7], sampling: s }));
  return (await Promise.all(done)).map((f) => f.outputTokens);
}

describe("a steady decode reuses the engine's step records", () => {
  test("over a pipelined model: depth-many batch arrays, one chunk and one row sampling per sequence", async () => {
    const params = [greedy, seeded, { ...seeded, seed: 6n, topP: 0.8 }];
    const want = await decode(new FakeRunner(), params);
    const model = new EagerPipelined();
    expect(await decode(model, params)).toEqual(want);
    // The prefill, then 39 decode steps of all three rows, each posted ahead of the one before's end.
    const steady = model.seen.slice(1);
    expect(steady.length).toBe(39);
    expect(steady.every((s) => s.batch.length === 3)).toBe(true);
    // The engine keeps three steps in flight (its default depth): three step records in turn.
    expect(distinct(steady.map((s) => s.batch))).toBe(3);
    expect(distinct(steady.map((s) => s.sampling))).toBe(3);
    for (let r = 0; r < 3; r++) {
      // Its prefill chunk too: one record per sequence, ever.
      expect(distinct(model.seen.map((s) => s.chunks[r]))).toBe(1);
      expect(distinct(steady.map((s) => s.chunks[r]!.tokens))).toBe(1);
      expect(distinct(steady.map((s) => s.rows[r]))).toBe(1);
    }
    // A seeded row's stream as it stands steps ahead: one scratch generator, copied into.
    for (const r of [1, 2]) expect(distinct(steady.map((s) => s.rngs[r]))).toBe(1);
  });

  test("over a model's callback: the same depth-many callbacks, one per step record, and the same tokens", async () => {
    const params = [greedy, seeded];
    const model = new EagerPipelined();
    expect(await decode(model, params)).toEqual(await decode(new FakeRunner(), params));
    expect(model.dones.length).toBe(40);
    expect(distinct(model.seen.slice(1).map((s) => s.batch))).toBe(3);
    // Nothing made per step to hear of its end: each step record's own callback.
    expect(distinct(model.dones)).toBe(3);
  });

  test("over a synchronous model: one step record, the same batch array every step", async () => {
    const batches: (readonly SeqChunk[])[] = [];
    const chunks: SeqChunk[] = [];
    const inner = new FakeRunner();
    const model = transformerPort({
      cfg: { vocabSize: inner.vocabSize },
      forward: (pool, batch, out) => {
        batches.push(batch);
        chunks.push(batch[1]!);
        inner.forward(pool, batch, out);
      },
    });
    expect(await decode(model, [greedy, seeded])).toEqual(await decode(new FakeRunner(), [greedy, seeded]));
    expect(batches.length).toBe(40);
    expect(distinct(batches)).toBe(1);
    expect(distinct(chunks)).toBe(1);
  });
});
