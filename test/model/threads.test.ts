import { afterAll, describe, expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { Transformer, kvShapeOf, type ModelConfig } from "../../src/model/index.ts";
import { syntheticWeights, castWeights } from "../../src/model/compute/weights.ts";
import { Seq, bits, tokens } from "./helpers.ts";

// Big enough that every matmul of a prefill, and the classifier of a decode, is split.
const MID: ModelConfig = {
  name: "mid",
  dim: 64,
  hiddenDim: 160,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 1024,
  maxSeqLen: 128,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const B = 8;
const models: Transformer[] = [];
afterAll(() => models.forEach((m) => m.close()));

function model(threads: number, dtype: "f32" | "q8_0" = "f32"): Transformer {
  const m = new Transformer(MID, castWeights(MID, syntheticWeights(MID, 3), dtype), { threads });
  models.push(m);
  return m;
}

/** Prefill three prompts in one batch, then decode all three for a few steps in one batch. */
function run(m: Transformer, together: boolean): number[][] {
  const pool = new KvPool(kvShapeOf(MID, B), 64);
  const seqs = [0, 1, 2].map(() => new Seq(pool));
  const prompts = [tokens(37, 1, MID.vocabSize), tokens(5, 2, MID.vocabSize), tokens(20, 3, MID.vocabSize)];
  const logits: number[][] = [];
  const out = new Float32Array(3 * MID.vocabSize);
  const pass = (chunks: number[][]): void => {
    if (together) {
      m.forward(
        pool,
        chunks.map((c, s) => seqs[s]!.chunk(c)),
        out,
      );
      for (let s = 0; s < 3; s++) logits.push(bits(out.subarray(s * MID.vocabSize, (s + 1) * MID.vocabSize)));
    } else {
      for (let s = 0; s < 3; s++) {
        m.forward(pool, [seqs[s]!.chunk(chunks[s]!)], out);
        logits.push(bits(out.subarray(0, MID.vocabSize)));
      }
    }
  };
  pass(prompts);
  for (let t = 0; t < 4; t++) pass([[t + 1], [t + 7], [t + 9]]);
  return logits;
}

describe("threads", () => {
  test("logits are bit identical across thread counts and batches", async () => {
    const want = run(model(1), false);
    for (const threads of [1, 2, 3]) {
      const m = model(threads);
      await m.ready();
      expect(m.threads).toBe(threads);
      expect(run(m, true)).toEqual(want);
      expect(run(m, false)).toEqual(want);
      // Helpers take chunks once awake and scheduled, which a loaded machine may delay.
      const deadline = performance.now() + 5000;
      while (threads > 1 && m.splitCalls === 0 && performance.now() < deadline) expect(run(m, true)).toEqual(want);
      if (threads > 1) expect(m.splitCalls).toBeGreaterThan(0);
    }
  });

  test("q8 0 logits are bit identical across thread counts", async () => {
    const want = run(model(1, "q8_0"), true);
    const [three, two] = [model(3, "q8_0"), model(2, "q8_0")];
    await Promise.all([three.ready(), two.ready()]);
    expect(run(three, true)).toEqual(want);
    expect(run(two, false)).toEqual(want);
  });
});

// Long contexts and wide heads: every decode step's attention (4 sequences over ~150 positions)
// is big enough to be shared with the helpers, as the prefill's is.
const WIDE: ModelConfig = { ...MID, name: "wide", dim: 128, hiddenDim: 64, nLayers: 1, nHeads: 4, nKvHeads: 4, maxSeqLen: 256 };

/** Four prompts prefilled apart, then decoded together or apart; the pool in the kernel memory or not. */
function runWide(m: Transformer, together: boolean, inKernel: boolean): number[][] {
  const shape = kvShapeOf(WIDE, B);
  const pool = inKernel ? m.kvPool(shape, 100) : new KvPool(shape, 100);
  const seqs = [0, 1, 2, 3].map(() => new Seq(pool));
  const logits: number[][] = [];
  const out = new Float32Array(4 * WIDE.vocabSize);
  seqs.forEach((s, i) => m.forward(pool, [s.chunk(tokens(140 + 3 * i, 11 + i, WIDE.vocabSize))], out));
  for (let t = 0; t < 6; t++) {
    const chunks = seqs.map((s, i) => s.chunk([(t * 5 + i) % WIDE.vocabSize]));
    if (together) m.forward(pool, chunks, out);
    else chunks.forEach((c, i) => m.forward(pool, [c], out.subarray(i * WIDE.vocabSize)));
    for (let s = 0; s < 4; s++) logits.push(bits(out.subarray(s * WIDE.vocabSize, (s + 1) * WIDE.vocabSize)));
  }
  return logits;
}

describe("threaded attention", () => {
  test("decode attention is bit identical across threads batches and where the slab lives", async () => {
    const one = new Transformer(WIDE, syntheticWeights(WIDE, 5), { threads: 1 });
    models.push(one);
    const want = runWide(one, false, false);
    expect(runWide(one, true, true)).toEqual(want);
    for (const threads of [2, 3]) {
      const m = new Transformer(WIDE, syntheticWeights(WIDE, 5), { threads });
      models.push(m);
      await m.ready();
      for (const inKernel of [true, false]) {
        expect(runWide(m, true, inKernel)).toEqual(want);
        expect(runWide(m, false, inKernel)).toEqual(want);
      }
      const deadline = performance.now() + 5000;
      while (m.splitCalls === 0 && performance.now() < deadline) expect(runWide(m, true, true)).toEqual(want);
      expect(m.splitCalls).toBeGreaterThan(0);
    }
  });
});
