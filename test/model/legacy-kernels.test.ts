import { afterAll, describe, expect, test } from "bun:test";
import { LEGACY_DTYPES, legacyShape } from "../../src/model/compute/legacy-quants.ts";
import { MatmulKernel, matmulLegacyRef, matmulRef } from "../../src/model/compute/matmul.ts";
import { dequantize, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { toFloat32 } from "../../src/model/load/raw-tensor.ts";
import { bits, expectSlices } from "./helpers.ts";
import { expectRowsAlone, expectWithinXQuantization, legacyBlocks as randomBlocks } from "./quant-helpers.ts";

// The q4_0, q4_1, q5_0 and q5_1 integer kernels (kernels/assembly/legacy.ts) against their
// plain-JS order (matmulLegacyRef), bit for bit, over ggml blocks of random bits; against a
// dequantize-then-dot in f64 within what x's 8-bit quantization allows; across slices, batches
// and threads; rows read back as the file's dequantized values.

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

function kernel(ms: PackedMatrix[], n: number, threads = 1): MatmulKernel {
  const k = new MatmulKernel(
    ms.map((matrix) => ({ matrix, cols: n })),
    { threads },
  );
  kernels.push(k);
  return k;
}

function input(rows: number, n: number, seed: number): Float32Array {
  return new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + seed) * 3 * (1 + ((i >> 5) % 3)));
}

function ref(x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  matmulLegacyRef(y, x, w, wOff, rows, n, d);
  return bits(y);
}

describe("legacy block integer kernels", () => {
  for (const dt of LEGACY_DTYPES) {
    test(`${dt}: every slice, batch and tail equals the reference, and matmulRef is it`, () => {
      for (const n of [32, 96, 256]) {
        const w = randomBlocks(dt, 29, n, n + 1);
        const k = kernel([w], n);
        const slices = [
          [0, 29],
          [8, 16],
          [3, 9],
          [5, 1],
          [24, 5],
        ] as const;
        expectSlices(k, w, n, [1, 2, 3, 5, 8, 13, 16], slices, input, ref);
        const x = input(3, n, 9);
        const y = new Float32Array(3 * 29);
        matmulRef(y, x, w, 0, 3, n, 29);
        expect(bits(y)).toEqual(ref(x, w, 0, 3, n, 29));
      }
    });

    test(`${dt}: x quantization edges give the reference bits`, () => {
      const n = 64;
      const w = randomBlocks(dt, 16, n, 3);
      const k = kernel([w], n);
      const cases: [string, (x: Float32Array) => void][] = [
        ["a zero block", (x) => x.fill(0, 0, 32)],
        ["ties", (x) => x.set([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], 0)],
        ["a NaN", (x) => (x[40] = Number.NaN)],
        ["huge values", (x) => x.fill(3e38, 0, 16)],
        // 1 / s overflows: q clamps to +-127 (0 * inf is NaN, so 0), as kquants.ts's x.
        ["a scale whose inverse overflows", (x) => (x.fill(1e-37, 0, 32), (x[5] = 0), (x[6] = -5e-38))],
      ];
      for (const [name, edit] of cases) {
        const x = input(3, n, 7);
        edit(x);
        const y = new Float32Array(3 * 16);
        k.matmul(y, x, w, 0, 3, n, 16);
        expect([name, bits(y)]).toEqual([name, ref(x, w, 0, 3, n, 16)]);
      }
    });

    test(`${dt}: a row gives the same bits alone, in any batch, on 1 or 2 threads`, async () => {
      const n = 512;
      const d = 96;
      const w = randomBlocks(dt, d, n, 21);
      const one = kernel([w], n, 1);
      const two = kernel([w], n, 2);
      await two.ready();
      expectRowsAlone(one, two, input(8, n, 3), n, d);
    });

    test(`${dt}: within x's quantization of the f64 dequantize-then-dot; rows read back as the file's values`, () => {
      const n = 256;
      const d = 21;
      const w = randomBlocks(dt, d, n, 33);
      const wf = dequantize(w);
      expect(bits(wf)).toEqual(bits(toFloat32({ name: "w", dtype: dt, shape: [d, n], bytes: w.bytes })));
      const k = kernel([w], n);
      const back = new Float32Array(d * n);
      for (let r = 0; r < d; r++) k.rowInto(k.views[0]!, r * n, n, back, r * n);
      expect(bits(back)).toEqual(bits(wf));
      const x = input(2, n, 5);
      const y = new Float32Array(2 * d);
      k.matmul(y, x, w, 0, 2, n, d);
      expectWithinXQuantization(y, x, wf, 2, n, d, 32);
    });
  }
});

describe("the relaxed dot's condition in the legacy kernels (kquants.ts, THE RELAXED DOT)", () => {
  for (const dt of LEGACY_DTYPES) {
    test(`${dt}: weights and x at the extremes the condition allows give the reference bits`, () => {
      // Every weight at 15 (31 with the fifth bit) or 0, x at +-127: each i16 lane filled to its bound.
      const n = 128;
      const d = 16;
      const { bytes: bb, min } = legacyShape(dt);
      for (const v of [0xff, 0]) {
        const w = randomBlocks(dt, d, n, 5);
        for (let at = 0; at < w.bytes.length; at += bb) w.bytes.fill(v, at + (min ? 4 : 2), at + bb);
        const k = kernel([w], n);
        for (const [xname, f] of [
          ["x +127", () => 1],
          ["x -127", () => -1],
          ["x +-127 at random", (i: number) => (Math.sin(i * 12.9898) > 0 ? 1 : -1)],
        ] as const) {
          for (const rows of [1, 4, 5, 8, 13]) {
            const x = new Float32Array(rows * n).map((_, i) => f(i));
            const y = new Float32Array(rows * d);
            k.matmul(y, x, w, 0, rows, n, d);
            expect([v, xname, rows, bits(y)]).toEqual([v, xname, rows, ref(x, w, 0, rows, n, d)]);
          }
        }
      }
    });
  }
});
