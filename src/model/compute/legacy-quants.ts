/**
 * ggml's 32-weight block types before the K-quants, as this engine holds them (the file's own
 * bytes): f16 d, then (q4_1, q5_1) an f16 m, then (q5_*) a 32-bit little-endian mask of fifth
 * bits, then 16 bytes of nibbles; weight j takes the low nibble of byte j, weight j + 16 the high
 * one, and bit j (j + 16) of the mask. q = nibble | fifth bit << 4; the _0 types are d * (q - 8)
 * (q4_0) or d * (q - 16) (q5_0), the _1 types d * q + m, each computed in f64 and rounded once
 * to f32 (raw-tensor.ts's toFloat32 order, so a dequantized row is the widened path's bit for bit).
 */
import { f16Values } from "./f16-bits.ts";

export type LegacyDType = "q4_0" | "q4_1" | "q5_0" | "q5_1";
export const LEGACY_DTYPES: readonly LegacyDType[] = ["q4_0", "q4_1", "q5_0", "q5_1"];
export const QK_LEGACY = 32;

export function isLegacy(dt: string): dt is LegacyDType {
  return (LEGACY_DTYPES as readonly string[]).includes(dt);
}

/** What a type's blocks hold: bytes, whether an m (the _1 types), whether fifth bits, and q's offset in the _0 types. */
export function legacyShape(dt: LegacyDType): { bytes: number; min: boolean; five: boolean; offset: number } {
  const min = dt === "q4_1" || dt === "q5_1";
  const five = dt === "q5_0" || dt === "q5_1";
  return { bytes: 18 + (min ? 2 : 0) + (five ? 4 : 0), min, five, offset: min ? 0 : five ? -16 : -8 };
}

/** The unsigned q (0..15, or 0..31 with the fifth bit) of weight j of the block at `at`. */
export function legacyQ(dt: LegacyDType, b: Uint8Array, at: number, j: number): number {
  const { min, five } = legacyShape(dt);
  const qs = at + 2 + (min ? 2 : 0) + (five ? 4 : 0);
  const byte = b[qs + (j & 15)]!;
  const nib = j < 16 ? byte & 0xf : byte >> 4;
  if (!five) return nib;
  const mask = at + 2 + (min ? 2 : 0);
  return nib | (((b[mask + (j >> 3)]! >> (j & 7)) & 1) << 4);
}

/** The f16 bits of the block's d (and m, for the _1 types). */
export function legacyD(b: Uint8Array, at: number): number {
  return b[at]! | (b[at + 1]! << 8);
}

export function legacyM(b: Uint8Array, at: number): number {
  return b[at + 2]! | (b[at + 3]! << 8);
}

/** Weight value of unsigned q with the block's d and m (as f16 values), by the order in the header. */
export function legacyValue(dt: LegacyDType, q: number, d: number, m: number): number {
  const { min, offset } = legacyShape(dt);
  return min ? q * d + m : (q + offset) * d;
}

/** Elements from .. from + count of a legacy matrix's bytes as f32, into out at outAt. */
export function dequantizeLegacyInto(dt: LegacyDType, b: Uint8Array, from: number, count: number, out: Float32Array, outAt: number): void {
  const lut = f16Values();
  const { bytes, min } = legacyShape(dt);
  for (let e = from; e < from + count; e++) {
    const at = Math.floor(e / QK_LEGACY) * bytes;
    const m = min ? lut[legacyM(b, at)]! : 0;
    out[outAt + e - from] = legacyValue(dt, legacyQ(dt, b, at, e % QK_LEGACY), lut[legacyD(b, at)]!, m);
  }
}

/** Throws when a block's d (or m) is inf or NaN: the kernels widen f16 exactly for finite values only. */
export function assertFiniteLegacy(dt: LegacyDType, b: Uint8Array, from: number, blocks: number, firstBlock: number): void {
  const { bytes, min } = legacyShape(dt);
  for (let i = 0; i < blocks; i++) {
    const at = from + i * bytes;
    for (const h of min ? [legacyD(b, at), legacyM(b, at)] : [legacyD(b, at)]) {
      if ((h & 0x7c00) === 0x7c00) throw new Error(`${dt} block ${firstBlock + i} has an inf or NaN scale (0x${h.toString(16)})`);
    }
  }
}
