import { expect, test } from "bun:test";
import { type ModelConfig, Transformer, kvShapeOf } from "../../src/model/index.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { FORWARD_PHASES } from "../../src/model/compute/transformer.ts";

const CFG: ModelConfig = {
  name: "profiled",
  dim: 64,
  hiddenDim: 160,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 512,
  maxSeqLen: 64,
  ropeTheta: 10000,
  normEps: 1e-5,
};

test("Transformer.profile times every phase a forward runs, and no more than the forward took", () => {
  const m = new Transformer(CFG, syntheticWeights(CFG, 4));
  const pool = m.kvPool(kvShapeOf(CFG, 8), 8);
  const table = pool.allocate(4)!;
  const out = new Float32Array(CFG.vocabSize);
  m.forward(pool, [{ tokens: [1, 2, 3, 4, 5], startPos: 0, blockTable: table }], out); // warm, unprofiled
  const prof = new Float64Array(FORWARD_PHASES.length);
  m.profile = prof;
  const t0 = performance.now();
  for (let p = 5; p < 25; p++) m.forward(pool, [{ tokens: [p], startPos: p, blockTable: table }], out);
  const elapsed = performance.now() - t0;
  m.profile = null;
  m.close();
  const spent = Object.fromEntries(FORWARD_PHASES.map((ph, i) => [ph, prof[i]! > 0]));
  // No biases in this model: that phase never runs.
  expect(spent).toEqual(Object.fromEntries(FORWARD_PHASES.map((ph) => [ph, ph !== "bias"])));
  expect(prof.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(elapsed);
});
