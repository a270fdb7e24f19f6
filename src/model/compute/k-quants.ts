/**
 * ggml's K-quant blocks as this engine holds them (the file's own bytes, never inflated): 256
 * weights a super-block along a row.
 *
 *   q4_k (144 bytes): f16 d, f16 dmin, 12 bytes packing eight 6-bit scales and eight 6-bit mins
 *     (get_scale_min_k4's packing), 128 bytes of nibbles: sub-blocks 2p and 2p + 1 (32 weights
 *     each) share bytes 32p .. 32p + 31, the first the low nibbles, the second the high ones.
 *     Weight i of sub-block j is d * sc_j * q - dmin * m_j.
 *   q5_k (176 bytes): q4_k's d, dmin and scales, then 32 bytes of fifth bits (weight i of
 *     sub-block j takes bit j of byte i & 31 as 16), then q4_k's 128 bytes of nibbles.
 *   q6_k (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales,
 *     f16 d. Weight i (half = i >> 7, r = i & 127, k = r >> 5, l = r & 31) takes the low nibble
 *     (k < 2) or high nibble (k >= 2) of ql[64 half + l + 32 (k & 1)] and bits 2k, 2k + 1 of
 *     qh[32 half + l]: q = that - 32, times d * sc[i >> 4].
 *
 * A value made f32 is computed in f64 then rounded once, in the order written above (the same
 * as raw-tensor.ts's toFloat32, so a dequantized row is the widened path's row bit for bit).
 */
import { f16Bits, f16Values } from "./f16-bits.ts";

export const QK_K = 256;
export const Q4_K_BLOCK_BYTES = 144;
export const Q5_K_BLOCK_BYTES = 176;
export const Q6_K_BLOCK_BYTES = 210;

export type KDType = "q4_k" | "q5_k" | "q6_k";

export function isK(dt: string): dt is KDType {
  return dt === "q4_k" || dt === "q5_k" || dt === "q6_k";
}

export function kBlockBytes(kt: KDType): number {
  return kt === "q4_k" ? Q4_K_BLOCK_BYTES : kt === "q5_k" ? Q5_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES;
}

/** The 6-bit scale (low byte) and min (high byte) of sub-block j of the q4_k block at `at`. */
export function q4kScaleMin(b: Uint8Array, at: number, j: number): number {
  const s = at + 4;
  if (j < 4) return (b[s + j]! & 63) | ((b[s + j + 4]! & 63) << 8);
  const sc = (b[s + j + 4]! & 0xf) | ((b[s + j - 4]! >> 6) << 4);
  const m = (b[s + j + 4]! >> 4) | ((b[s + j]! >> 6) << 4);
  return sc | (m << 8);
}

/** The 4-bit q of weight i of the q4_k block at `at`. */
export function q4kQuant(b: Uint8Array, at: number, i: number): number {
  const j = i >> 5;
  const byte = b[at + 16 + 32 * (j >> 1) + (i & 31)]!;
  return j & 1 ? byte >> 4 : byte & 0xf;
}

/** The 5-bit q (0..31) of weight i of the q5_k block at `at`. */
export function q5kQuant(b: Uint8Array, at: number, i: number): number {
  const j = i >> 5;
  const byte = b[at + 48 + 32 * (j >> 1) + (i & 31)]!;
  return (j & 1 ? byte >> 4 : byte & 0xf) | (((b[at + 16 + (i & 31)]! >> j) & 1) << 4);
}

/** The 6-bit q (0..63, before the - 32) of weight i of the q6_k block at `at`. */
export function q6kQuant(b: Uint8Array, at: number, i: number): number {
  const half = i >> 7;
  const k = (i >> 5) & 3;
  const l = i & 31;
  const low = b[at + 64 * half + l + (k & 1 ? 32 : 0)]!;
  const h = (b[at + 128 + 32 * half + l]! >> (2 * k)) & 3;
  return (k >= 2 ? low >> 4 : low & 0xf) | (h << 4);
}

/** The int8 scale of sub-block k (16 weights) of the q6_k block at `at`. */
export function q6kScale(b: Uint8Array, at: number, k: number): number {
  return (b[at + 192 + k]! << 24) >> 24;
}

/** Elements from .. from + count of a K-quant matrix's bytes as f32, into out at outAt. */
export function dequantizeKInto(kt: KDType, b: Uint8Array, from: number, count: number, out: Float32Array, outAt: number): void {
  const lut = f16Values();
  const bb = kBlockBytes(kt);
  for (let e = from; e < from + count; e++) {
    const at = Math.floor(e / QK_K) * bb;
    const i = e % QK_K;
    if (kt === "q6_k") {
      const d = lut[b[at + 208]! | (b[at + 209]! << 8)]!;
      out[outAt + e - from] = d * q6kScale(b, at, i >> 4) * (q6kQuant(b, at, i) - 32);
    } else {
      const d = lut[b[at]! | (b[at + 1]! << 8)]!;
      const dmin = lut[b[at + 2]! | (b[at + 3]! << 8)]!;
      const sm = q4kScaleMin(b, at, i >> 5);
      out[outAt + e - from] = d * (sm & 0xff) * (kt === "q5_k" ? q5kQuant(b, at, i) : q4kQuant(b, at, i)) - dmin * (sm >> 8);
    }
  }
}

/** Throws when a block's f16 scale (d, or dmin) is inf or NaN: the kernels widen f16 exactly for finite values only. */
export function assertFiniteK(kt: KDType, b: Uint8Array, from: number, blocks: number, firstBlock: number): void {
  const bb = kBlockBytes(kt);
  for (let i = 0; i < blocks; i++) {
    const at = from + i * bb;
    for (const o of kt === "q6_k" ? [208] : [0, 2]) {
      const h = b[at + o]! | (b[at + o + 1]! << 8);
      if ((h & 0x7c00) === 0x7c00) throw new Error(`${kt} block ${firstBlock + i} has an inf or NaN scale (0x${h.toString(16)})`);
    }
  }
}

const nearest = (v: number, lo: number, hi: number): number => Math.max(lo, Math.min(hi, Math.round(v)));

/**
 * f32 rows into q4_k blocks: a plain quantizer (not ggml's searching one), for casting a model
 * at load and for tests. Per 32-weight sub-block, scale (max - min') / 15 with min' = min(0,
 * lowest) and min -min'; both quantized to 6 bits against d = max scale / 63 and dmin = max min
 * / 63 (f16); each q the nearest of 0..15 to (x + dmin * m) / (d * sc).
 */
export function quantizeQ4K(src: Float32Array, from: number, elems: number, out: Uint8Array, at: number): void {
  quantizeQ4Q5K(false, src, from, elems, out, at);
}

/** f32 rows into q5_k blocks: quantizeQ4K's recipe with 32 levels (0..31), the fifth bits in their own bytes. */
export function quantizeQ5K(src: Float32Array, from: number, elems: number, out: Uint8Array, at: number): void {
  quantizeQ4Q5K(true, src, from, elems, out, at);
}

function quantizeQ4Q5K(five: boolean, src: Float32Array, from: number, elems: number, out: Uint8Array, at: number): void {
  const scales = new Float64Array(8);
  const mins = new Float64Array(8);
  const levels = five ? 31 : 15;
  const bb = five ? Q5_K_BLOCK_BYTES : Q4_K_BLOCK_BYTES;
  const qs = five ? 48 : 16;
  for (let o = 0; o < elems; o += QK_K, at += bb) {
    for (let j = 0; j < 8; j++) {
      let lo = 0;
      let hi = Number.NEGATIVE_INFINITY;
      for (let l = 0; l < 32; l++) {
        const v = src[from + o + 32 * j + l]!;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
      scales[j] = (hi - lo) / levels;
      mins[j] = -lo;
    }
    const d = f16Round(Math.max(...scales) / 63);
    const dmin = f16Round(Math.max(...mins) / 63);
    const sc = [...scales].map((s) => (d > 0 ? nearest(s / d, 0, 63) : 0));
    const mn = [...mins].map((m) => (dmin > 0 ? nearest(m / dmin, 0, 63) : 0));
    out.fill(0, at, at + bb);
    setF16(out, at, d);
    setF16(out, at + 2, dmin);
    for (let j = 0; j < 4; j++) {
      out[at + 4 + j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
      out[at + 8 + j] = mn[j]! | ((mn[j + 4]! >> 4) << 6);
      out[at + 12 + j] = (sc[j + 4]! & 0xf) | ((mn[j + 4]! & 0xf) << 4);
    }
    for (let j = 0; j < 8; j++) {
      const scale = d * sc[j]!;
      const off = dmin * mn[j]!;
      for (let l = 0; l < 32; l++) {
        const q = scale > 0 ? nearest((src[from + o + 32 * j + l]! + off) / scale, 0, levels) : 0;
        out[at + qs + 32 * (j >> 1) + l]! |= j & 1 ? (q & 15) << 4 : q & 15;
        if (five) out[at + 16 + l]! |= (q >> 4) << j;
      }
    }
  }
}

/**
 * f32 rows into q6_k blocks (a plain quantizer, as quantizeQ4K): per 16-weight sub-block scale
 * max |x| / 32, quantized to int8 against d = max |scale| / 127 (f16); each q - 32 the nearest of
 * -32..31 to x / (d * sc).
 */
export function quantizeQ6K(src: Float32Array, from: number, elems: number, out: Uint8Array, at: number): void {
  const scales = new Float64Array(16);
  for (let o = 0; o < elems; o += QK_K, at += Q6_K_BLOCK_BYTES) {
    for (let k = 0; k < 16; k++) {
      let a = 0;
      for (let l = 0; l < 16; l++) a = Math.max(a, Math.abs(src[from + o + 16 * k + l]!));
      scales[k] = a / 32;
    }
    const d = f16Round(Math.max(...scales) / 127);
    out.fill(0, at, at + Q6_K_BLOCK_BYTES);
    setF16(out, at + 208, d);
    for (let k = 0; k < 16; k++) {
      const sc = d > 0 ? nearest(scales[k]! / d, -128, 127) : 0;
      out[at + 192 + k] = sc & 0xff;
      const step = d * sc;
      for (let l = 0; l < 16; l++) {
        const i = 16 * k + l;
        const q = (step > 0 ? nearest(src[from + o + i]! / step, -32, 31) : 0) + 32;
        const half = i >> 7;
        const kk = (i >> 5) & 3;
        const ll = i & 31;
        out[at + 64 * half + ll + (kk & 1 ? 32 : 0)]! |= kk >= 2 ? (q & 0xf) << 4 : q & 0xf;
        out[at + 128 + 32 * half + ll]! |= (q >> 4) << (2 * kk);
      }
    }
  }
}

function f16Round(x: number): number {
  return f16Values()[f16Bits(x)]!;
}

function setF16(out: Uint8Array, at: number, x: number): void {
  const h = f16Bits(x);
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}
