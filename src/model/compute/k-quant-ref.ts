import { f16Values } from "./f16-bits.ts";
import { Q4_K_BLOCK_BYTES, Q5_K_BLOCK_BYTES, Q6_K_BLOCK_BYTES, QK_K, q4kQuant, q4kScaleMin, q5kQuant, q6kQuant, q6kScale } from "./k-quants.ts";
import type { PackedMatrix } from "./packed.ts";
import { quantizeXRef, xRef } from "./x-quant-ref.ts";

// The plain-JS K-quant path's sums of quantized x per 16, grown as needed.
let refSums = new Int32Array(0);

/** x row at xa quantized as kernels/assembly/kquants.ts's quantize_k_x does (quantizeXRef per 256, in [-127, 127]), with the sums of q per 16 in refSums. */
function quantizeKRowRef(x: Float32Array, xa: number, n: number): void {
  quantizeXRef(x, xa, n, QK_K, -127, 127);
  if (refSums.length < n / 16) refSums = new Int32Array(n / 16);
  for (let k = 0; k < n / 16; k++) {
    let t = 0;
    for (let j = 0; j < 16; j++) t += xRef.q[16 * k + j]!;
    refSums[k] = t;
  }
}

/**
 * The q4_k and q5_k kernels' order in plain JS (THE K ORDER in kernels/assembly/kquants.ts), on
 * ggml's blocks: x quantized per 256, then per output one running f32 sum over the super-blocks
 * of f32(A) * (d * s) - f32(B) * (dmin * s), A = sum_j sc_j * (q . x)_j, B = sum_j m_j * (sum x)_j.
 */
export function matmulQ4KRef(y: Float32Array, x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): void {
  const five = w.dtype === "q5_k";
  const quant = five ? q5kQuant : q4kQuant;
  const bb = five ? Q5_K_BLOCK_BYTES : Q4_K_BLOCK_BYTES;
  const f = Math.fround;
  const lut = f16Values();
  const b = w.bytes;
  const blocks = n / QK_K;
  for (let r = 0; r < rows; r++) {
    quantizeKRowRef(x, r * n, n);
    const { q: refQ, scales: refScales } = xRef;
    for (let i = 0; i < d; i++) {
      const first = (wOff + i * n) / QK_K;
      let acc = 0;
      for (let c = 0; c < blocks; c++) {
        const at = (first + c) * bb;
        let A = 0;
        let B = 0;
        for (let j = 0; j < 8; j++) {
          const sm = q4kScaleMin(b, at, j);
          let dot = 0;
          for (let l = 0; l < 32; l++) dot += quant(b, at, 32 * j + l) * refQ[c * QK_K + 32 * j + l]!;
          A += (sm & 0xff) * dot;
          B += (sm >> 8) * (refSums[c * 16 + 2 * j]! + refSums[c * 16 + 2 * j + 1]!);
        }
        const s = refScales[c]!;
        const dd = f(lut[b[at]! | (b[at + 1]! << 8)]! * s);
        const dm = f(lut[b[at + 2]! | (b[at + 3]! << 8)]! * s);
        acc = f(acc + f(f(f(A) * dd) - f(f(B) * dm)));
      }
      y[r * d + i] = acc;
    }
  }
}

/**
 * The q6_k kernel's order in plain JS (THE K ORDER): per output one running f32 sum over the
 * super-blocks of f32(A) * (d * s), A = sum_k sc_k * ((q . x)_k - 32 * (sum x)_k).
 */
export function matmulQ6KRef(y: Float32Array, x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): void {
  const f = Math.fround;
  const lut = f16Values();
  const b = w.bytes;
  const blocks = n / QK_K;
  for (let r = 0; r < rows; r++) {
    quantizeKRowRef(x, r * n, n);
    const { q: refQ, scales: refScales } = xRef;
    for (let i = 0; i < d; i++) {
      const first = (wOff + i * n) / QK_K;
      let acc = 0;
      for (let c = 0; c < blocks; c++) {
        const at = (first + c) * Q6_K_BLOCK_BYTES;
        let A = 0;
        for (let k = 0; k < 16; k++) {
          let dot = 0;
          for (let l = 0; l < 16; l++) dot += q6kQuant(b, at, 16 * k + l) * refQ[c * QK_K + 16 * k + l]!;
          A += q6kScale(b, at, k) * (dot - 32 * refSums[c * 16 + k]!);
        }
        const dd = f(lut[b[at + 208]! | (b[at + 209]! << 8)]! * refScales[c]!);
        acc = f(acc + f(f(A) * dd));
      }
      y[r * d + i] = acc;
    }
  }
}
