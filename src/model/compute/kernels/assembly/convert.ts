// Rows of f16, bf16 or f32 weights to ggml's q8_0 blocks: `--dtype q8_0` on a file stored
// otherwise, at load, on every kernel thread (q8-converter.ts cuts the rows into chunks). The
// bytes are the ones quantizeQ8Row in packed.ts writes, for every input (tests hold the two
// together), so a model converted here is the model converted there:
//
//   per block of 32: amax = the largest |x| that is not NaN (0 at least); d = amax / 127 and
//   id = 1 / d (0 when d is 0), each rounded to f32; d stored as f16 (nearest, ties to even);
//   q = x * id rounded to f32, then rounded to an integer with halves away from zero (inf and NaN
//   to 0).
//
// Every f32 operation here is one IEEE operation on f32 values, so it rounds as JS's Math.fround
// of the f64 result does (a single f64 operation on f32 operands then rounded to f32 gives the
// f32 operation's result). The half-away rounding is done as trunc(|v|) + (|v| - trunc(|v|) >= 0.5),
// both exact, where |v| + 0.5 rounded to f32 would not be.

import { f16Bits4 } from "./math";

/** The source row's dtype (q8-converter.ts writes the same numbers). */
const SRC_F32: i32 = 0;
const SRC_F16: i32 = 1;
const SRC_BF16: i32 = 2;

const QK: i32 = 32;
const BLOCK_BYTES: usize = 34;

/**
 * f16 patterns zero-extended into i32 lanes to f32x4, exact for every pattern: finite ones by
 * moving exponent-mantissa to f32's places and rebiasing by 2^112 (subnormals included), inf and
 * NaN by setting f32's exponent to all ones (the mantissa kept), then the sign.
 */
@inline function f16Exact(h: v128): v128 {
  const em = v128.and(h, i32x4.splat(0x7fff));
  const finite = f32x4.mul(i32x4.shl(em, 13), f32x4.splat(reinterpret<f32>(0x77800000)));
  const special = v128.or(i32x4.shl(em, 13), i32x4.splat(0x7f800000));
  const v = v128.bitselect(special, finite, i32x4.gt_s(em, i32x4.splat(0x7bff)));
  return v128.or(v, i32x4.shl(v128.and(h, i32x4.splat(0x8000)), 16));
}

/** Weights i .. i + 3 of the row at p as f32x4. */
@inline function load4(src: i32, p: usize, i: i32): v128 {
  if (src == SRC_F32) return v128.load(p + (<usize>i << 2));
  const h = i32x4.extend_low_i16x8_u(v128.load64_zero(p + (<usize>i << 1)));
  if (src == SRC_F16) return f16Exact(h);
  return i32x4.shl(h, 16);
}

/**
 * q = x * id rounded to an integer, halves away from zero; an infinite or NaN product to 0, as
 * JS's Int8Array stores them (id is infinite when d is a subnormal below 2^-128). A finite
 * product is within 127.5 of zero, so no other value wraps.
 */
@inline function quant4(x: v128, id: v128): v128 {
  const v = f32x4.mul(x, id);
  const a = f32x4.abs(v);
  const t = f32x4.trunc(a);
  // A true compare is -1: subtracting it adds one.
  let q = i32x4.sub(i32x4.trunc_sat_f32x4_s(t), f32x4.ge(f32x4.sub(a, t), f32x4.splat(0.5)));
  q = v128.and(q, f32x4.lt(a, f32x4.splat(Infinity)));
  const neg = f32x4.lt(v, f32x4.splat(0));
  return i32x4.sub(v128.xor(q, neg), neg);
}

/** One block of 32 weights at p (element i of the row) to its 34 bytes at o. */
@inline function block(src: i32, p: usize, i: i32, o: usize): void {
  const x0 = load4(src, p, i);
  const x1 = load4(src, p, i + 4);
  const x2 = load4(src, p, i + 8);
  const x3 = load4(src, p, i + 12);
  const x4 = load4(src, p, i + 16);
  const x5 = load4(src, p, i + 20);
  const x6 = load4(src, p, i + 24);
  const x7 = load4(src, p, i + 28);
  // pmax keeps its first operand unless the second is larger, so a NaN second operand never wins,
  // as in JS's `m > amax`: every pmax here has the running maximum, never NaN, first.
  let m = f32x4.pmax(f32x4.splat(0), f32x4.abs(x0));
  m = f32x4.pmax(m, f32x4.abs(x1));
  m = f32x4.pmax(m, f32x4.abs(x2));
  m = f32x4.pmax(m, f32x4.abs(x3));
  m = f32x4.pmax(m, f32x4.abs(x4));
  m = f32x4.pmax(m, f32x4.abs(x5));
  m = f32x4.pmax(m, f32x4.abs(x6));
  m = f32x4.pmax(m, f32x4.abs(x7));
  let amax = f32x4.extract_lane(m, 0);
  const m1 = f32x4.extract_lane(m, 1);
  const m2 = f32x4.extract_lane(m, 2);
  const m3 = f32x4.extract_lane(m, 3);
  if (m1 > amax) amax = m1;
  if (m2 > amax) amax = m2;
  if (m3 > amax) amax = m3;
  const d: f32 = amax / 127;
  const idv = f32x4.splat(d != 0 ? <f32>1 / d : 0);
  store<u16>(o, <u16>i32x4.extract_lane(f16Bits4(f32x4.splat(d)), 0));
  const a = i16x8.narrow_i32x4_s(quant4(x0, idv), quant4(x1, idv));
  const b = i16x8.narrow_i32x4_s(quant4(x2, idv), quant4(x3, idv));
  const c = i16x8.narrow_i32x4_s(quant4(x4, idv), quant4(x5, idv));
  const e = i16x8.narrow_i32x4_s(quant4(x6, idv), quant4(x7, idv));
  v128.store(o, i8x16.narrow_i16x8_s(a, b), 2);
  v128.store(o, i8x16.narrow_i16x8_s(c, e), 18);
}

/** The largest of the 8 u16 lanes of v. */
@inline function maxU16(v: v128): u32 {
  v = i16x8.max_u(v, i8x16.shuffle(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = i16x8.max_u(v, i8x16.shuffle(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
  v = i16x8.max_u(v, i8x16.shuffle(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
  return <u32>i16x8.extract_lane_u(v, 0);
}

/**
 * q of the 4 f16 patterns sign-extended into h's i32 lanes, for a block without inf or NaN: the
 * patterns made f32 times 2^-112 (exact, as f16bits in f16.ts), times c = id * 2^112 when that is
 * exact (id < 2^16), else times 2^112 then id. Either way one rounding of the same real x * id.
 * id is finite (d is at least 2^-24 / 127) and |x * id| about 127 at most: no lane is inf or NaN.
 */
@inline function quantF16(h: v128, c: v128, id: v128, folded: bool): v128 {
  const bits = v128.and(i32x4.mul(h, i32x4.splat(8192)), i32x4.splat(0x8fffe000));
  const v = folded ? f32x4.mul(bits, c) : f32x4.mul(f32x4.mul(bits, f32x4.splat(reinterpret<f32>(0x77800000))), id);
  const a = f32x4.abs(v);
  const t = f32x4.trunc(a);
  const q = i32x4.sub(i32x4.trunc_sat_f32x4_s(t), f32x4.ge(f32x4.sub(a, t), f32x4.splat(0.5)));
  const neg = f32x4.lt(v, f32x4.splat(0));
  return i32x4.sub(v128.xor(q, neg), neg);
}

/**
 * One f16 block: amax found on the patterns (below inf, |x| grows with the 15 bits of exponent
 * and mantissa read as an integer), then quantF16; a block holding inf or NaN goes to `block`.
 */
@inline function blockF16(p: usize, i: i32, o: usize): void {
  const at = p + (<usize>i << 1);
  const v0 = v128.load(at);
  const v1 = v128.load(at, 16);
  const v2 = v128.load(at, 32);
  const v3 = v128.load(at, 48);
  const m7 = i16x8.splat(0x7fff);
  const em = maxU16(i16x8.max_u(i16x8.max_u(v128.and(v0, m7), v128.and(v1, m7)), i16x8.max_u(v128.and(v2, m7), v128.and(v3, m7))));
  if (em >= 0x7c00) {
    block(SRC_F16, p, i, o);
    return;
  }
  // em as f32: exponent-mantissa moved up, rebiased (exact, subnormals too).
  const amax = reinterpret<f32>(em << 13) * reinterpret<f32>(0x77800000);
  const d: f32 = amax / 127;
  const idf: f32 = d != 0 ? <f32>1 / d : 0;
  store<u16>(o, <u16>i32x4.extract_lane(f16Bits4(f32x4.splat(d)), 0));
  const id = f32x4.splat(idf);
  const folded = idf < 65536;
  const c = f32x4.splat(idf * reinterpret<f32>(0x77800000));
  let a: v128, b: v128;
  if (folded) {
    a = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v0), c, id, true), quantF16(i32x4.extend_high_i16x8_s(v0), c, id, true));
    b = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v1), c, id, true), quantF16(i32x4.extend_high_i16x8_s(v1), c, id, true));
    v128.store(o, i8x16.narrow_i16x8_s(a, b), 2);
    a = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v2), c, id, true), quantF16(i32x4.extend_high_i16x8_s(v2), c, id, true));
    b = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v3), c, id, true), quantF16(i32x4.extend_high_i16x8_s(v3), c, id, true));
  } else {
    a = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v0), c, id, false), quantF16(i32x4.extend_high_i16x8_s(v0), c, id, false));
    b = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v1), c, id, false), quantF16(i32x4.extend_high_i16x8_s(v1), c, id, false));
    v128.store(o, i8x16.narrow_i16x8_s(a, b), 2);
    a = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v2), c, id, false), quantF16(i32x4.extend_high_i16x8_s(v2), c, id, false));
    b = i16x8.narrow_i32x4_s(quantF16(i32x4.extend_low_i16x8_s(v3), c, id, false), quantF16(i32x4.extend_high_i16x8_s(v3), c, id, false));
  }
  v128.store(o, i8x16.narrow_i16x8_s(a, b), 18);
}

@inline function rows(src: i32, dst: usize, x: usize, n: i32, g0: i32, g1: i32): void {
  const inRow = <usize>n << (src == SRC_F32 ? 2 : 1);
  const outRow = <usize>(n / QK) * BLOCK_BYTES;
  for (let r = g0; r < g1; r++) {
    const p = x + <usize>r * inRow;
    let o = dst + <usize>r * outRow;
    for (let i = 0; i < n; i += QK) {
      if (src == SRC_F16) blockF16(p, i, o);
      else block(src, p, i, o);
      o += BLOCK_BYTES;
    }
  }
}

/**
 * Rows g0 .. g1 of the row-major matrix at x (rows of n weights of dtype `src`, n a multiple of
 * 32) to q8_0 at dst (row r's blocks at r * n / 32 * 34): a chunk of one conversion.
 */
export function convert_q8_rows(dst: usize, x: usize, src: i32, n: i32, g0: i32, g1: i32): void {
  if (src == SRC_F16) rows(SRC_F16, dst, x, n, g0, g1);
  else if (src == SRC_BF16) rows(SRC_BF16, dst, x, n, g0, g1);
  else rows(SRC_F32, dst, x, n, g0, g1);
}
