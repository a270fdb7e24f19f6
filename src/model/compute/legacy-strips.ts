import { f16Values } from "./f16-bits.ts";
import { type LegacyDType, legacyD, legacyQ, legacyShape, legacyValue, QK_LEGACY } from "./legacy-quants.ts";

/**
 * THE LEGACY STRIP LAYOUT that kernels/assembly/legacy.ts reads (stated there in full): a strip
 * of 8 rows is a group per 32-block: the rows' d, the _1 types' m, each half strip's nibbles in
 * quads of columns of four rows (as the K layout's), then the q5 types' fifth bits. The same bits
 * a weight as ggml's blocks.
 */
export function legacyGroupBytes(dt: LegacyDType): number {
  const { min, five } = legacyShape(dt);
  return 144 + (min ? 16 : 0) + (five ? 32 : 0);
}

/** Index e of column i (0..31) of row k of a half strip: quads of columns, four rows each (the relaxed dot's four bytes a lane). */
function slot(k: number, i: number): number {
  return (i >> 2) * 16 + (k & 3) * 4 + (i & 3);
}

/**
 * Where weight i of row k sits in a group (min: the _1 types), packed in one number so a row
 * read per token allocates nothing: ((nibble byte * 2 + high) * 256 + fifth bit's byte) * 8 + bit.
 */
function place(min: boolean, k: number, i: number): number {
  const e = slot(k, i);
  const half = k >> 2;
  const nib = 16 + (min ? 16 : 0) + half * 64 + (e >> 5) * 16 + (e & 15);
  return ((nib * 2 + ((e >> 4) & 1)) * 256 + 144 + (min ? 16 : 0) + half * 16 + (e & 15)) * 8 + (e >> 4);
}

/** Up to 8 rows of src (ggml blocks, rows of n weights, from its start) into one zeroed strip at out. */
export function packLegacyStrip(dt: LegacyDType, src: Uint8Array, rows: number, n: number, out: Uint8Array): void {
  const { bytes, min, five } = legacyShape(dt);
  const gb = legacyGroupBytes(dt);
  const blocks = n / QK_LEGACY;
  for (let k = 0; k < rows; k++) {
    for (let c = 0; c < blocks; c++) {
      const at = (k * blocks + c) * bytes;
      const g = c * gb;
      out[g + 2 * k] = src[at]!;
      out[g + 2 * k + 1] = src[at + 1]!;
      if (min) {
        out[g + 16 + 2 * k] = src[at + 2]!;
        out[g + 16 + 2 * k + 1] = src[at + 3]!;
      }
      for (let i = 0; i < QK_LEGACY; i++) {
        const q = legacyQ(dt, src, at, i);
        const pl = place(min, k, i);
        const nb = pl >> 11;
        out[g + (nb >> 1)]! |= nb & 1 ? (q & 15) << 4 : q & 15;
        if (five) out[g + ((pl >> 3) & 255)]! |= (q >> 4) << (pl & 7);
      }
    }
  }
}

/** Columns j0 .. j0 + count of row k of the strip at `base` in u8, made f32 into out at outAt (legacy-quants.ts's values). */
export function readLegacyStripRow(
  dt: LegacyDType,
  u8: Uint8Array,
  base: number,
  k: number,
  j0: number,
  count: number,
  out: Float32Array,
  outAt: number,
): void {
  const lut = f16Values();
  const { min, five } = legacyShape(dt);
  const gb = legacyGroupBytes(dt);
  for (let j = j0; j < j0 + count; j++) {
    const g = base + Math.floor(j / QK_LEGACY) * gb;
    const pl = place(min, k, j % QK_LEGACY);
    const nb = pl >> 11;
    const q = (nb & 1 ? u8[g + (nb >> 1)]! >> 4 : u8[g + (nb >> 1)]! & 15) | (five ? ((u8[g + ((pl >> 3) & 255)]! >> (pl & 7)) & 1) << 4 : 0);
    const d = lut[legacyD(u8, g + 2 * k)]!;
    const m = min ? lut[legacyD(u8, g + 16 + 2 * k)]! : 0;
    out[outAt + j - j0] = legacyValue(dt, q, d, m);
  }
}
