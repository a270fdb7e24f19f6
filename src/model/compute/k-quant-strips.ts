import { f16Values } from "./f16-bits.ts";
import { type KDType, kBlockBytes, QK_K, q4kQuant, q4kScaleMin, q5kQuant, q6kQuant } from "./k-quants.ts";

/**
 * The K STRIP LAYOUT that kernels/assembly/kquants.ts reads (stated there in full): a strip of 8
 * rows is a group per super-block; in a group, the 8 rows' f16 scales, their sub-block scales
 * (and q4_k's mins) as bytes, then each half strip's quantized weights, four rows interleaved
 * in quads of columns (kSlot), then q5_k's fifth bits. q4_k: 1184 bytes a group (4.625 bits a
 * weight: ggml's packed 6-bit scales are unpacked to bytes); q5_k: 1440 (5.625); q6_k: 1680
 * (6.5625, ggml's own).
 */
export const Q4K_GROUP = 1184;
export const Q5K_GROUP = 1440;
export const Q6K_GROUP = 1680;

export function kGroupBytes(kt: KDType): number {
  return kt === "q4_k" ? Q4K_GROUP : kt === "q5_k" ? Q5K_GROUP : Q6K_GROUP;
}

// The place functions return their fields packed in one number (byte * 8 + bit, ...): a row read
// per token (the embedding's) allocates nothing.

/** Where q5_k's fifth bit of weight i of row k sits in a group: byte * 8 + bit (bit t of byte b is e = 16t + b). */
function q5BitPlace(k: number, i: number): number {
  const e = kSlot(k, i & 31);
  return (Q4K_GROUP + (k >> 2) * 128 + (i >> 5) * 16 + (e & 15)) * 8 + (e >> 4);
}

/**
 * Index e of column i of row k (of a half strip) within its sub-block: quads of columns, four rows
 * each, so 16 consecutive e are four columns of four rows, the bytes the relaxed dot sums per lane.
 */
function kSlot(k: number, i: number): number {
  return (i >> 2) * 16 + (k & 3) * 4 + (i & 3);
}

/** Where weight i (0..255) of row k of a q4_k group sits: its byte * 2 + 1 if in the high nibble. */
function q4Place(k: number, i: number): number {
  const e = kSlot(k, i & 31);
  return (160 + (k >> 2) * 512 + (i >> 5) * 64 + (e >> 5) * 16 + (e & 15)) * 2 + ((e >> 4) & 1);
}

/** Where the min of sub-block j of row k (of a half strip) sits among its half's 32: pairs of sub-blocks, four rows each. */
function minSlot(k: number, j: number): number {
  return (j >> 1) * 8 + (k & 3) * 2 + (j & 1);
}

/**
 * Where weight i of row k of a q6_k group sits: its unit's byte for e = 16t + b (t = e >> 4, b =
 * e & 15) as unit * 64 + t * 16 + b. Quads t = 0..2 hold the value in bits 0..5 of byte 16t + b;
 * quad 3's value is spread over the top bits (6..7) of bytes b (its bits 4..5), 16 + b (2..3)
 * and 32 + b (0..1): kquants.ts's unpacking.
 */
function q6Place(k: number, i: number): number {
  const e = kSlot(k, i & 15);
  return (144 + (k >> 2) * 768 + (i >> 4) * 48) * 64 + e;
}

/** Where the int8 scale of sub-block s (0..15) of row k sits in a q6_k group: pairs of sub-blocks, four rows each. */
function q6ScaleSlot(k: number, s: number): number {
  return 16 + (k >> 2) * 64 + (s >> 1) * 8 + (k & 3) * 2 + (s & 1);
}

/** Up to 8 rows of src (ggml blocks, rows of n weights, from its start) into one zeroed strip at out. */
export function packKStrip(kt: KDType, src: Uint8Array, rows: number, n: number, out: Uint8Array): void {
  const bb = kBlockBytes(kt);
  const gb = kGroupBytes(kt);
  const blocks = n / QK_K;
  for (let k = 0; k < rows; k++) {
    const half = k >> 2;
    const kk = k & 3;
    for (let c = 0; c < blocks; c++) {
      const at = (k * blocks + c) * bb;
      const g = c * gb;
      if (kt === "q6_k") {
        out[g + 2 * k] = src[at + 208]!;
        out[g + 2 * k + 1] = src[at + 209]!;
        for (let s = 0; s < 16; s++) out[g + q6ScaleSlot(k, s)] = src[at + 192 + s]!;
        for (let i = 0; i < QK_K; i++) {
          const q = q6kQuant(src, at, i);
          const pl = q6Place(k, i);
          const u = g + (pl >> 6);
          const e = pl & 63;
          if (e < 48) out[u + e]! |= q;
          else {
            const b = e & 15;
            out[u + b]! |= (q >> 4) << 6;
            out[u + 16 + b]! |= ((q >> 2) & 3) << 6;
            out[u + 32 + b]! |= (q & 3) << 6;
          }
        }
      } else {
        out[g + 2 * k] = src[at]!;
        out[g + 2 * k + 1] = src[at + 1]!;
        out[g + 16 + 2 * k] = src[at + 2]!;
        out[g + 16 + 2 * k + 1] = src[at + 3]!;
        for (let j = 0; j < 8; j++) {
          const sm = q4kScaleMin(src, at, j);
          out[g + 32 + half * 32 + minSlot(kk, j)] = sm & 0xff;
          out[g + 96 + half * 32 + minSlot(kk, j)] = sm >> 8;
        }
        for (let i = 0; i < QK_K; i++) {
          const q = kt === "q5_k" ? q5kQuant(src, at, i) : q4kQuant(src, at, i);
          const p = q4Place(k, i);
          out[g + (p >> 1)]! |= p & 1 ? (q & 15) << 4 : q & 15;
          if (kt === "q5_k") {
            const b5 = q5BitPlace(k, i);
            out[g + (b5 >> 3)]! |= (q >> 4) << (b5 & 7);
          }
        }
      }
    }
  }
}

/**
 * Columns j0 .. j0 + count of row k of the K strip at `base` in u8 (rows of n), made f32 into out
 * at outAt by the blocks' definition in the order k-quants.ts states (the same bits as
 * dequantizing ggml's block): the embedding's lookup when it is stored q4_k or q6_k.
 */
export function readKStripRow(kt: KDType, u8: Uint8Array, base: number, k: number, j0: number, count: number, out: Float32Array, outAt: number): void {
  const lut = f16Values();
  const gb = kGroupBytes(kt);
  const half = k >> 2;
  const kk = k & 3;
  // A sub-block at a time (16 weights for q6_k, 32 else), its group's scales read once for it:
  // read per weight, they made the lookup of an 8-row batch's embeddings 4 ms of an 8B step.
  const sub = kt === "q6_k" ? 16 : 32;
  for (let j = j0; j < j0 + count; ) {
    const g = base + Math.floor(j / QK_K) * gb;
    const i0 = j % QK_K;
    const end = Math.min(j0 + count, j - (i0 % sub) + sub);
    const d = lut[u8[g + 2 * k]! | (u8[g + 2 * k + 1]! << 8)]!;
    if (kt === "q6_k") {
      const dsc = d * ((u8[g + q6ScaleSlot(k, i0 >> 4)]! << 24) >> 24);
      for (; j < end; j++) {
        const pl = q6Place(k, j % QK_K);
        const u = g + (pl >> 6);
        const e = pl & 63;
        const b = e & 15;
        const q = e < 48 ? u8[u + e]! & 63 : ((u8[u + b]! >> 6) << 4) | ((u8[u + 16 + b]! >> 6) << 2) | (u8[u + 32 + b]! >> 6);
        out[outAt + j - j0] = dsc * (q - 32);
      }
    } else {
      const dmin = lut[u8[g + 16 + 2 * k]! | (u8[g + 16 + 2 * k + 1]! << 8)]!;
      const dsc = d * u8[g + 32 + half * 32 + minSlot(kk, i0 >> 5)]!;
      const dm = dmin * u8[g + 96 + half * 32 + minSlot(kk, i0 >> 5)]!;
      for (; j < end; j++) {
        const i = j % QK_K;
        const p = q4Place(k, i);
        let q = p & 1 ? u8[g + (p >> 1)]! >> 4 : u8[g + (p >> 1)]! & 15;
        if (kt === "q5_k") {
          const b5 = q5BitPlace(k, i);
          q |= ((u8[g + (b5 >> 3)]! >> (b5 & 7)) & 1) << 4;
        }
        out[outAt + j - j0] = dsc * q - dm;
      }
    }
  }
}
