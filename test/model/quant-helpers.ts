import { expect } from "bun:test";
import { f16Bits, f16Shift } from "../../src/model/compute/f16-bits.ts";
import { type LegacyDType, legacyShape } from "../../src/model/compute/legacy-quants.ts";
import type { MatmulKernel } from "../../src/model/compute/matmul.ts";
import type { Matrix, PackedMatrix } from "../../src/model/compute/packed.ts";
import { packStrips, stripLayoutBytes } from "../../src/model/compute/strip-layout.ts";
import { bits } from "./helpers.ts";

// Shared by the integer kernels' tests (k-quant-kernels, legacy-kernels): random block bytes,
// the alone/batched/threads identity and the f64 dequantize-then-dot bound.

/** `count` pseudo-random bytes (every bit pattern of a block's quants, scales and mins). */
export function randomBytes(count: number, seed: number): Uint8Array {
  const bytes = new Uint8Array(count);
  let s = seed >>> 0;
  for (let i = 0; i < count; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    bytes[i] = s >>> 24;
  }
  return bytes;
}

/** A small finite scale for block b, of either sign (f16-representable magnitudes 1e-3 .. 5e-1). */
export function blockScale(b: number): number {
  return (1 + (b % 5)) * 10 ** ((b % 3) - 3) * (b % 4 === 3 ? -1 : 1);
}

/** A d x n matrix of random legacy blocks (q4_0 .. q5_1): every bit random but d (and m), finite and small. */
export function legacyBlocks(dtype: LegacyDType, d: number, n: number, seed: number): PackedMatrix {
  const { bytes: bb, min } = legacyShape(dtype);
  const bytes = randomBytes(((d * n) / 32) * bb, seed);
  const dv = new DataView(bytes.buffer);
  for (let at = 0, b = 0; at < bytes.length; at += bb, b++) {
    dv.setUint16(at, f16Bits(blockScale(b)), true);
    if (min) dv.setUint16(at + 2, f16Bits(-blockScale(b) * 7.5), true);
  }
  return { dtype, cols: n, length: d * n, bytes };
}

/**
 * Each token row of x (8 rows of n) against the matrix placed in `one` and `two` (1 and 2
 * threads) gives the bits it gives alone on one thread, in batches of 1, 3 and 8 and a slice
 * from row 2; `two` is run until a helper thread took a chunk.
 */
export function expectRowsAlone(one: MatmulKernel, two: MatmulKernel, x: Float32Array, n: number, d: number): void {
  const alone = [...Array(8).keys()].map((r) => {
    const y = new Float32Array(d);
    one.matmul(y, x.subarray(r * n, (r + 1) * n), one.views[0]!, 0, 1, n, d);
    return bits(y);
  });
  const deadline = performance.now() + 20000;
  for (const k of [one, two]) {
    // On a busy machine the caller may take every chunk; repeat until a helper took some.
    do {
      for (const [from, rows] of [
        [0, 1],
        [0, 3],
        [0, 8],
        [2, 5],
      ] as const) {
        const y = new Float32Array(rows * d);
        k.matmul(y, x.subarray(from * n, (from + rows) * n), k.views[0]!, 0, rows, n, d);
        for (let r = 0; r < rows; r++) expect(bits(y.subarray(r * d, (r + 1) * d))).toEqual(alone[from + r]!);
      }
    } while (k === two && k.splitCalls === 0 && performance.now() < deadline);
  }
  expect(two.splitCalls).toBeGreaterThan(0);
}

/**
 * y (rows x d) within x's quantization of the f64 dot of the dequantized weights wf (d x n)
 * with x: x is quantized per `block` to q * s with |x - q s| <= s / 2 (plus x * (1 / s)'s own
 * rounding, < 127 * 2^-24 steps), so |sum w q s - sum w x| <= (s / 2 + 2^-16 s) sum |w| per
 * block; the f32 arithmetic adds at most (blocks + 4) roundings of 2^-24 relative to the sum
 * of its terms' magnitudes, bounded (generously, times 64) by sum (|w| + 1) (|x| + s). Returns
 * the worst error over its bound.
 */
export function expectWithinXQuantization(y: Float32Array, x: Float32Array, wf: Float32Array, rows: number, n: number, d: number, block: number): number {
  let worst = 0;
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < d; i++) {
      let exact = 0;
      let bound = 0;
      let mag = 0;
      for (let b = 0; b < n / block; b++) {
        let amax = 0;
        for (let j = 0; j < block; j++) amax = Math.max(amax, Math.abs(x[r * n + b * block + j]!));
        const s = Math.fround(amax / 127);
        let sw = 0;
        for (let j = 0; j < block; j++) {
          const wv = wf[i * n + b * block + j]!;
          const xv = x[r * n + b * block + j]!;
          exact += wv * xv;
          sw += Math.abs(wv);
          mag += (Math.abs(wv) + 1) * (Math.abs(xv) + s);
        }
        bound += (s / 2 + s * 2 ** -16) * sw;
      }
      bound += (n / block + 4) * 2 ** -23 * mag * 64;
      const err = Math.abs(y[r * d + i]! - exact);
      expect(err).toBeLessThanOrEqual(bound);
      worst = Math.max(worst, err / bound);
    }
  }
  return worst;
}

/**
 * The strips the kernels place for m's `rows` rows of n f16 weights when every |w| < 128: the JS
 * packer's, of the patterns f16Shift (f16-bits.ts) makes. Packed as bf16, whose strips lie out
 * 16-bit patterns the same way: packStrips checks f16 finite, and a shifted pattern of a value
 * from 64 up has the plain coding's inf exponent.
 */
export function shiftedStrips(m: PackedMatrix, rows: number, n: number): Uint8Array<ArrayBuffer> {
  const u = new Uint16Array(m.bytes.slice().buffer);
  for (let i = 0; i < u.length; i++) u[i] = f16Shift(u[i]!);
  const out = new Uint8Array(stripLayoutBytes("f16", rows, n));
  packStrips({ ...m, dtype: "bf16", bytes: new Uint8Array(u.buffer) }, 0, rows, n, out, 0);
  return out;
}

/** Whether the matrix MatmulKernel `k` placed as its view v holds the strips of m in the shifted coding (else the plain). */
export function placedShifted(k: MatmulKernel, v: Matrix, m: PackedMatrix, rows: number, n: number): boolean {
  const at = k.offsetOf(v);
  const got = new Uint8Array(k.memory!.buffer, at, stripLayoutBytes("f16", rows, n));
  const shifted = shiftedStrips(m, rows, n);
  const plain = new Uint8Array(got.length);
  packStrips(m, 0, rows, n, plain, 0);
  const same = (a: Uint8Array) => a.every((b, i) => b === got[i]);
  if (same(shifted)) return true;
  if (same(plain)) return false;
  throw new Error("placed f16 strips are neither coding's");
}
