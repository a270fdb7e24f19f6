import { afterAll, describe, expect, test } from "bun:test";
import { f16Bits } from "../../src/model/compute/f16-bits.ts";
import { matmulQ4KRef, matmulQ6KRef } from "../../src/model/compute/k-quant-ref.ts";
import { kBlockBytes } from "../../src/model/compute/k-quants.ts";
import { MatmulKernel, matmulRef } from "../../src/model/compute/matmul.ts";
import { castMatrix, dequantize, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { toFloat32 } from "../../src/model/load/raw-tensor.ts";
import { readFileSync } from "node:fs";
import binaryen from "assemblyscript/binaryen";
import { bits, expectSlices } from "./helpers.ts";
import { blockScale, expectRowsAlone, expectWithinXQuantization, randomBytes } from "./quant-helpers.ts";

// The q4_k, q5_k and q6_k integer kernels (kernels/assembly/kquants.ts) against their plain-JS order
// (k-quant-ref.ts), bit for bit, over ggml blocks of random bits (every nibble, scale and min
// pattern) and over quantized smooth data; against a dequantize-then-dot in f64 within the bound
// x's 8-bit quantization allows; across tiles, tails, batches and threads.

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

type KType = "q4_k" | "q5_k" | "q6_k";
const TYPES: KType[] = ["q4_k", "q5_k", "q6_k"];

/** A d x n matrix of random ggml blocks: every bit random but the f16 scales, which are finite and small. */
function randomBlocks(dtype: KType, d: number, n: number, seed: number): PackedMatrix {
  const bb = kBlockBytes(dtype);
  const bytes = randomBytes(((d * n) / 256) * bb, seed);
  const dv = new DataView(bytes.buffer);
  for (let at = 0, b = 0; at < bytes.length; at += bb, b++) {
    if (dtype !== "q6_k") {
      dv.setUint16(at, f16Bits(blockScale(b)), true);
      dv.setUint16(at + 2, f16Bits(Math.abs(blockScale(b)) * 0.7), true);
    } else dv.setUint16(at + 208, f16Bits(blockScale(b)), true);
  }
  return { dtype, cols: n, length: d * n, bytes };
}

function smooth(dtype: KType, d: number, n: number, seed: number): PackedMatrix {
  const f = new Float32Array(d * n).map((_, i) => Math.sin(i * 0.61 + seed) * (1 + (i % 7)) * 10 ** ((i % 5) - 2));
  return castMatrix(f, dtype, n) as PackedMatrix;
}

function input(rows: number, n: number, seed: number): Float32Array {
  return new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + seed) * 3 * (1 + ((i >> 8) % 3)));
}

function ref(x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  (w.dtype === "q6_k" ? matmulQ6KRef : matmulQ4KRef)(y, x, w, wOff, rows, n, d);
  return bits(y);
}

describe("K-quant integer kernels", () => {
  for (const dt of TYPES) {
    test(`${dt}: every tile, tail and slice equals the reference, on random blocks and quantized data`, () => {
      for (const n of [256, 512]) {
        for (const make of [randomBlocks, smooth]) {
          // 29 rows: three whole strips and a padded fourth.
          const w = make(dt, 29, n, n + 3);
          const k = kernel([w], n);
          const slices = [
            [0, 29],
            [8, 16],
            [3, 9],
            [5, 1],
            [11, 18],
            [24, 5],
          ] as const;
          expectSlices(k, w, n, [1, 2, 3, 4, 5, 8, 9, 13, 16, 21], slices, input, ref);
        }
      }
    });

    test(`${dt}: matmulRef is the kernel's order, and the fallback gives the kernel's bits`, () => {
      const n = 512;
      const w = randomBlocks(dt, 13, n, 5);
      const x = input(3, n, 2);
      const y = new Float32Array(3 * 13);
      matmulRef(y, x, w, 0, 3, n, 13);
      expect(bits(y)).toEqual(ref(x, w, 0, 3, n, 13));
      const fb = new MatmulKernel([{ matrix: w, cols: n }], { simd: false });
      expect(fb.simd).toBe(false);
      const z = new Float32Array(3 * 13);
      fb.matmul(z, x, fb.views[0]!, 0, 3, n, 13);
      expect(bits(z)).toEqual(bits(y));
    });

    test(`${dt}: x quantization edges give the reference bits`, () => {
      const n = 512;
      const w = randomBlocks(dt, 16, n, 9);
      const k = kernel([w], n);
      const cases: [string, (x: Float32Array) => void][] = [
        ["a zero super-block", (x) => x.fill(0, 0, 256)],
        ["a super-block of -0", (x) => x.fill(-0, 256, 512)],
        ["ties", (x) => x.set([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], 0)],
        ["a NaN", (x) => (x[300] = Number.NaN)],
        ["an infinity", (x) => (x[3] = Number.POSITIVE_INFINITY)],
        ["huge values", (x) => x.fill(3e38, 0, 16)],
        ["subnormal values", (x) => x.fill(1e-44, 256, 512)],
        // s = max / 127 is a nonzero subnormal whose inverse overflows: q clamps to +-127 (0 * inf is NaN, so 0).
        ["a scale whose inverse overflows", (x) => (x.fill(1e-37, 0, 256), (x[5] = 0), (x[6] = -5e-38))],
      ];
      for (const [name, edit] of cases) {
        for (const rows of [1, 5]) {
          const x = input(rows, n, 7);
          edit(x);
          const y = new Float32Array(rows * 16);
          k.matmul(y, x, w, 0, rows, n, 16);
          expect([name, bits(y)]).toEqual([name, ref(x, w, 0, rows, n, 16)]);
        }
      }
    });

    test(`${dt}: a row gives the same bits alone, in any batch, on 1 or 2 threads`, async () => {
      const n = 768;
      const d = 72;
      const w = randomBlocks(dt, d, n, 21);
      const one = kernel([w], n, 1);
      const two = kernel([w], n, 2);
      await two.ready();
      expectRowsAlone(one, two, input(8, n, 3), n, d);
    });

    test(`${dt}: within x's quantization of the f64 dequantize-then-dot`, () => {
      const n = 1024;
      const d = 24;
      for (const make of [randomBlocks, smooth]) {
        const w = make(dt, d, n, 33);
        const k = kernel([w], n);
        const x = input(3, n, 5);
        const y = new Float32Array(3 * d);
        k.matmul(y, x, w, 0, 3, n, d);
        const worst = expectWithinXQuantization(y, x, dequantize(w), 3, n, d, 256);
        console.log(`${dt} ${make.name}: worst error / bound ${worst.toFixed(3)}`);
      }
    });

    test(`${dt}: a placed matrix's rows read back as the file's dequantized values`, () => {
      const n = 512;
      const w = randomBlocks(dt, 11, n, 77);
      const k = kernel([w], n);
      const want = toFloat32({ name: "w", dtype: dt, shape: [11, n], bytes: w.bytes });
      expect(bits(dequantize(w))).toEqual(bits(want));
      const got = new Float32Array(11 * n);
      for (let r = 0; r < 11; r++) k.rowInto(k.views[0]!, r * n, n, got, r * n);
      expect(bits(got)).toEqual(bits(want));
      // A piece of a row, across a super-block's edge.
      const part = new Float32Array(40);
      k.rowInto(k.views[0]!, 5 * n + 230, 40, part);
      expect(bits(part)).toEqual(bits(want.subarray(5 * n + 230, 5 * n + 270)));
    });

    test(`${dt}: a block with an inf or NaN scale is refused when placed`, () => {
      const w = randomBlocks(dt, 8, 256, 1);
      w.bytes[dt === "q6_k" ? 3 * 210 + 209 : 7 * kBlockBytes(dt) + 3] = 0x7c;
      expect(() => kernel([w], 256)).toThrow(new RegExp(`${dt} block ${dt === "q6_k" ? 3 : 7} has an inf or NaN scale`));
    });
  }
});

/**
 * A d x n matrix whose every weight is at its type's maximum (q4_k 15, q5_k 31, q6_k 63; 6-bit
 * scales and mins 63, q6_k's int8 scales `q6Scale`) or, with `zero`, at 0: the extremes THE
 * RELAXED DOT (kquants.ts) allows.
 */
function extremeBlocks(dtype: KType, d: number, n: number, zero: boolean, q6Scale: number): PackedMatrix {
  const w = randomBlocks(dtype, d, n, 1);
  const bb = kBlockBytes(dtype);
  const v = zero ? 0 : 0xff;
  for (let at = 0; at < w.bytes.length; at += bb) {
    if (dtype === "q6_k") {
      w.bytes.fill(v, at, at + 192);
      w.bytes.fill(q6Scale & 0xff, at + 192, at + 208);
    } else w.bytes.fill(v, at + 4, at + bb);
  }
  return w;
}

describe("the relaxed dot's condition (kquants.ts, THE RELAXED DOT)", () => {
  for (const dt of TYPES) {
    test(`${dt}: weights and x at the extremes the condition allows give the reference bits`, () => {
      // x at +-127 everywhere against weights at their maximum fills each i16 lane to its bound
      // (q4_k 30480, q5_k 31496, q6_k 32004): one more pair before widening would wrap. Rows 1,
      // 4 and 5, 8 and 9, and 16 take every tile (kquants.ts' matmulK).
      const n = 512;
      const d = 16;
      const xs: [string, (i: number) => number][] = [
        ["x +127", () => 1],
        ["x -127", () => -1],
        ["x +-127 by pair", (i) => ((i >> 1) & 1 ? -1 : 1)],
        ["x +-127 at random", (i) => (Math.sin(i * 12.9898) > 0 ? 1 : -1)],
      ];
      for (const [wname, w] of [
        ["max", extremeBlocks(dt, d, n, false, 127)],
        ["max, scale -128", extremeBlocks(dt, d, n, false, -128)],
        ["zero", extremeBlocks(dt, d, n, true, 127)],
      ] as const) {
        const k = kernel([w], n);
        for (const [xname, f] of xs) {
          for (const rows of [1, 4, 5, 8, 9, 16]) {
            const x = new Float32Array(rows * n).map((_, i) => f(i));
            const y = new Float32Array(rows * d);
            k.matmul(y, x, w, 0, rows, n, d);
            expect([wname, xname, rows, bits(y)]).toEqual([wname, xname, rows, ref(x, w, 0, rows, n, d)]);
          }
        }
      }
    });
  }

  test("the kernel module validates, and its one relaxed instruction is i16x8.relaxed_dot_i8x16_i7x16_s", () => {
    const bytes = readFileSync(new URL("../../src/model/compute/kernels/kernels.wasm", import.meta.url));
    expect(WebAssembly.validate(bytes)).toBe(true);
    const m = binaryen.readBinary(new Uint8Array(bytes));
    const text = m.emitText();
    m.dispose();
    const relaxed = new Set(text.match(/[a-z0-9x]+\.relaxed_[a-z0-9_]+/g) ?? []);
    expect([...relaxed]).toEqual(["i16x8.relaxed_dot_i8x16_i7x16_s"]);
  });
});
