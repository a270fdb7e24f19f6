import { describe, expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { Transformer, kvShapeOf, type ModelConfig } from "../../src/model/index.ts";
import { qDimOf } from "../../src/model/compute/config.ts";
import { syntheticWeights, castWeights } from "../../src/model/compute/weights.ts";
import { B, Seq, TINY, bits, tokens } from "./helpers.ts";

// An engine without WebAssembly SIMD runs every kernel's plain-JS statement: the same bits, so
// such an engine and a SIMD one can share a cluster (disaggregated = colocated).
describe("fallback", () => {
  test("plain js forward equals simd forward bit for bit", () => {
    const shapes: [ModelConfig, { biases?: boolean; sharedClassifier?: boolean }][] = [
      [{ ...TINY, maxSeqLen: 48 }, {}],
      [{ ...TINY, maxSeqLen: 48, nKvHeads: 4 }, { sharedClassifier: true }],
      [{ ...TINY, maxSeqLen: 48, nKvHeads: 1, vocabSize: 61, hiddenDim: 50 }, {}],
      [{ ...TINY, maxSeqLen: 48, headDim: 10, nHeads: 6, nKvHeads: 2, ropeTheta: 1e6 }, { biases: true }],
    ];
    for (const [cfg, opts] of shapes) {
      const rowLengths = [cfg.dim, cfg.hiddenDim, qDimOf(cfg)];
      for (const dtype of ["f32", "f16", "q8_0"] as const) {
        if (dtype === "q8_0" && rowLengths.some((n) => n % 32 !== 0)) continue;
        const w = castWeights(cfg, syntheticWeights(cfg, 9, opts), dtype);
        const simd = new Transformer(cfg, w);
        const js = new Transformer(cfg, w, { simd: false });
        // A prefill across attention tiles, a second chunk, then decode steps.
        const run = (m: Transformer): number[][] => {
          const s = new Seq(new KvPool(kvShapeOf(cfg, B), 16));
          const out: number[][] = [];
          for (const chunk of [tokens(21, 3, cfg.vocabSize), tokens(6, 4, cfg.vocabSize), [1], [2], [3]]) {
            const o = new Float32Array(cfg.vocabSize);
            m.forward(s.pool, [s.chunk(chunk)], o);
            out.push(bits(o));
          }
          out.push(Array.from(s.pool.bytes.subarray(0, s.blockTable.length * s.pool.blockBytes)));
          return out;
        };
        expect(run(js)).toEqual(run(simd));
      }
    }
  });
});
