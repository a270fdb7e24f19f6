import { describe, expect, test } from "bun:test";
import { kvShapeOf, Transformer, type ModelConfig } from "../../src/model/index.ts";
import { syntheticWeights, castWeights } from "../../src/model/compute/weights.ts";
import { MatmulKernel } from "../../src/model/compute/matmul.ts";
import type { DType } from "../../src/model/compute/packed.ts";
import { KvPool } from "../../src/pool/index.ts";
import { bits, Seq, tokens } from "./helpers.ts";

// Every byte offset into the kernel memory is an unsigned 32-bit number: a wasm32 memory holds
// 4 GiB, and a model past 2 GiB (the 1B-shape F16 file, a KV pool that grows past it) has
// tensors, activations and KV blocks above 2^31, where `x & ~15`, `x >> 2` or an Int32Array
// slot read back as a signed number point somewhere else. These place everything past 2 GiB
// (and straddling it) and ask for the same bits as a low placement. The gap below is never
// written, so it costs address space only.

const CFG: ModelConfig = {
  name: "high",
  dim: 64,
  hiddenDim: 128,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 96,
  maxSeqLen: 64,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const BLOCK = 4;
const GiB = 2 ** 30;

/** Logits of a prefill of two sequences and four batched decode steps, all rows concatenated. */
function run(dtype: DType, gapBytes: number, threads: number, poolInKernel: boolean): Float32Array[] {
  const w = castWeights(CFG, syntheticWeights(CFG, 11), dtype);
  const m = new Transformer(CFG, w, { threads, gapBytes });
  const shape = kvShapeOf(CFG, BLOCK);
  const pool = poolInKernel ? m.kvPool(shape, 40) : new KvPool(shape, 40);
  const a = new Seq(pool);
  const b = new Seq(pool);
  const V = CFG.vocabSize;
  const outs: Float32Array[] = [];
  let out = new Float32Array(2 * V);
  m.forward(pool, [a.chunk(tokens(21, 1, V)), b.chunk(tokens(9, 2, V))], out);
  outs.push(out);
  for (let i = 0; i < 4; i++) {
    out = new Float32Array(2 * V);
    m.forward(pool, [a.chunk([(i * 7) % V]), b.chunk([(i * 5 + 3) % V])], out);
    outs.push(out);
  }
  m.close();
  return outs;
}

describe("kernel memory past 2 GiB", () => {
  for (const dtype of ["f32", "f16", "q8_0"] as const) {
    test(`${dtype}: tensors and the KV slab above 2 GiB give the bits of a low placement`, () => {
      const low = run(dtype, 0, 2, true);
      for (const gap of [2 * GiB + 4096, 2 * GiB - 64 * 1024, 3.5 * GiB]) {
        const high = run(dtype, gap, 2, true);
        for (let i = 0; i < low.length; i++) expect(bits(high[i]!)).toEqual(bits(low[i]!));
      }
    });
  }

  test("a pool outside the kernel memory with the weights above 2 GiB gives the same bits", () => {
    const low = run("f16", 0, 1, false);
    const high = run("f16", 2 * GiB + 4096, 1, false);
    for (let i = 0; i < low.length; i++) expect(bits(high[i]!)).toEqual(bits(low[i]!));
  });
});

describe("the plain-JS fallback says why", () => {
  test("kernels names the fallback and its reason; the SIMD path says wasm-simd", () => {
    const w = new Float32Array(64 * 64).fill(0.5);
    expect(new MatmulKernel([{ matrix: w, cols: 64 }]).kernels).toBe("wasm-simd");
    expect(new MatmulKernel([{ matrix: w, cols: 64 }], { simd: false }).kernels).toBe("plain-js (asked for)");
    // Weights that do not fit the wasm32 memory beside the kernels' room (a gap stands in for them).
    const big = new MatmulKernel([{ matrix: w, cols: 64 }], { gapBytes: 3.8 * GiB });
    expect(big.kernels).toMatch(/^plain-js \(weights of 3\.80 GiB exceed the kernel memory's 3\.75 GiB\)$/);
    expect(big.simd).toBe(false);
    const m = new Transformer(CFG, castWeights(CFG, syntheticWeights(CFG, 11), "f16"), { simd: false });
    expect(m.kernels).toBe("plain-js (asked for)");
  });
});
