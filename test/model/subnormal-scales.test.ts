import { afterAll, describe, expect, test } from "bun:test";
import { f16Bits } from "../../src/model/compute/f16-bits.ts";
import { matmulQ4KRef, matmulQ6KRef } from "../../src/model/compute/k-quant-ref.ts";
import { kBlockBytes } from "../../src/model/compute/k-quants.ts";
import { LEGACY_DTYPES, legacyShape } from "../../src/model/compute/legacy-quants.ts";
import { MatmulKernel, matmulLegacyRef, matmulQ8Ref } from "../../src/model/compute/matmul.ts";
import type { PackedMatrix } from "../../src/model/compute/packed.ts";
import { bits } from "./helpers.ts";
import { randomBytes } from "./quant-helpers.ts";

// Block scales below f16's smallest normal (2^-14) take their own path into f32 in the kernels
// (f16.ts, f16extScale: an f32 subnormal operand costs x86 a microcode assist per multiply). A
// q6_k d is often that small, so every integer kernel is fed such scales here, mixed with normal
// ones and zero inside each group of rows a vector converts at once, and must give its
// reference's bits on every path: one token (strip after strip), tiles of 2, 4 and
// 8, and the super-blocks unpacked for 8+ (q6_k) and 12+ (q5_k).

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

/** Scales cycling through f16 subnormals (smallest, largest, others, both signs), zero and small normals. */
const SCALES = [3.1e-6, -(2 ** -24), 2 ** -14, 6.09e-5, 0, -4.4e-5, 1e-3, 2 ** -24 * 1023, -(2 ** -20), 7.5e-7, -(2 ** -14)];

function scaleOf(b: number): number {
  return SCALES[b % SCALES.length]!;
}

/** A d x n matrix of random blocks of `dtype` whose f16 scales (and mins) follow SCALES. */
function blocks(dtype: string, d: number, n: number, seed: number): PackedMatrix {
  const kq = dtype === "q4_k" || dtype === "q5_k" || dtype === "q6_k";
  const bb = kq ? kBlockBytes(dtype) : dtype === "q8_0" ? 34 : legacyShape(dtype as never).bytes;
  const per = kq ? 256 : 32;
  const bytes = randomBytes(((d * n) / per) * bb, seed);
  const dv = new DataView(bytes.buffer);
  for (let at = 0, b = 0; at < bytes.length; at += bb, b++) {
    if (dtype === "q6_k") dv.setUint16(at + 208, f16Bits(scaleOf(b)), true);
    else {
      dv.setUint16(at, f16Bits(scaleOf(b)), true);
      if (dtype === "q4_k" || dtype === "q5_k" || (!kq && dtype !== "q8_0" && legacyShape(dtype as never).min))
        dv.setUint16(at + 2, f16Bits(scaleOf(b + 3)), true);
    }
  }
  return { dtype, cols: n, length: d * n, bytes } as PackedMatrix;
}

function ref(x: Float32Array, w: PackedMatrix, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  if (w.dtype === "q6_k") matmulQ6KRef(y, x, w, 0, rows, n, d);
  else if (w.dtype === "q4_k" || w.dtype === "q5_k") matmulQ4KRef(y, x, w, 0, rows, n, d);
  else if (w.dtype === "q8_0") matmulQ8Ref(y, x, w, 0, rows, n, d);
  else matmulLegacyRef(y, x, w, 0, rows, n, d);
  return bits(y);
}

describe("subnormal block scales (f16.ts, f16extScale)", () => {
  for (const dt of ["q4_k", "q5_k", "q6_k", "q8_0", ...LEGACY_DTYPES]) {
    test(`${dt}: scales below 2^-14, zero and normal ones mixed give the reference bits on every path`, () => {
      const n = 512;
      // 5 strips, walked one after another by one token (kStrip, strip1).
      const d = 40;
      const w = blocks(dt, d, n, 7);
      const k = new MatmulKernel([{ matrix: w, cols: n }], { threads: 1 });
      kernels.push(k);
      for (const rows of [1, 2, 4, 5, 8, 16]) {
        const x = new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + rows) * 3);
        const y = new Float32Array(rows * d);
        k.matmul(y, x, k.views[0]!, 0, rows, n, d);
        expect([dt, rows, bits(y)]).toEqual([dt, rows, ref(x, w, rows, n, d)]);
      }
    });
  }
});
