// exp and f32 -> f16 rounding, lane by lane, for the kernels (not an entry: nothing exported
// from here reaches JS). src/model/f32-math.ts writes the same steps out in plain JS.

/** exp's constants as f32 bit patterns (the same in f32-math.ts). */
const LOG2E: u32 = 0x3fb8aa3b;
const LN2_HI: u32 = 0x3f318000; // 0.693359375: n * LN2_HI is exact for |n| < 2^15
const LN2_LO: u32 = 0xb95e8083; // ln 2 - LN2_HI
const C2: u32 = 0x3f000000; // 1/2!
const C3: u32 = 0x3e2aaaab; // 1/3!
const C4: u32 = 0x3d2aaaab; // 1/4!
const C5: u32 = 0x3c088889; // 1/5!
const C6: u32 = 0x3ab60b61; // 1/6!
const EXP_LO: f32 = -87; // below: 0 (e^-87 is 1.6e-38, the edge of the normals)
const EXP_HI: f32 = 88; // above: inf

@inline function k4(bits: u32): v128 {
  return f32x4.splat(reinterpret<f32>(bits));
}

/**
 * e^x lane by lane: n = nearest(x * log2e) (ties to even), r = (x - n * LN2_HI) - n * LN2_LO,
 * p = Horner of the degree-6 Taylor polynomial (((((C6 r + C5) r + C4) r + C3) r + C2) r + 1) r + 1,
 * then p * 2^n. x > 88 gives inf, x < -87 gives 0, NaN stays NaN. Within 3 ulp of e^x (2.7 measured).
 */
@inline export function exp4(x: v128): v128 {
  const n = f32x4.nearest(f32x4.mul(x, k4(LOG2E)));
  const r = f32x4.sub(f32x4.sub(x, f32x4.mul(n, k4(LN2_HI))), f32x4.mul(n, k4(LN2_LO)));
  let p = k4(C6);
  p = f32x4.add(f32x4.mul(p, r), k4(C5));
  p = f32x4.add(f32x4.mul(p, r), k4(C4));
  p = f32x4.add(f32x4.mul(p, r), k4(C3));
  p = f32x4.add(f32x4.mul(p, r), k4(C2));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(1));
  p = f32x4.add(f32x4.mul(p, r), f32x4.splat(1));
  const scale = i32x4.shl(i32x4.add(i32x4.trunc_sat_f32x4_s(n), i32x4.splat(127)), 23);
  let y = f32x4.mul(p, scale);
  y = v128.bitselect(f32x4.splat(Infinity), y, f32x4.gt(x, f32x4.splat(EXP_HI)));
  // y with its lanes below EXP_LO cleared: the bitselect with +0 as one and-not.
  return v128.andnot(y, f32x4.lt(x, f32x4.splat(EXP_LO)));
}

/** exp4 of one value (the tails). */
@inline export function exp1(x: f32): f32 {
  return f32x4.extract_lane(exp4(f32x4.splat(x)), 0);
}

/**
 * f32 bit patterns to f16 bit patterns, lane by lane, rounding to nearest even as JS's
 * Float16Array does: overflow to inf (from 65520 up), subnormals rounded by an f32 add of 0.5,
 * every NaN to 0x7e00 (JS drops the sign too).
 */
@inline export function f16Bits4(x: v128): v128 {
  const sign = v128.and(x, i32x4.splat(0x80000000));
  const a = v128.xor(x, sign);
  // Normals: rebias the exponent, add 0xfff plus the lowest kept bit (ties to even), keep 13 up.
  const odd = v128.and(i32x4.shr_u(a, 13), i32x4.splat(1));
  const normal = i32x4.shr_u(i32x4.add(i32x4.add(a, i32x4.splat(0xc8000fff)), odd), 13);
  // Below 2^-14: a + 0.5 in f32 rounds a to a multiple of 2^-24, the f16 subnormal's unit.
  const sub = i32x4.sub(f32x4.add(a, f32x4.splat(0.5)), i32x4.splat(0x3f000000));
  // a's sign is clear, so signed compares decide as unsigned ones would: one instruction each on
  // x86, where an unsigned compare of 32-bit lanes takes three.
  let o = v128.bitselect(sub, normal, i32x4.lt_s(a, i32x4.splat(0x38800000)));
  o = v128.bitselect(i32x4.splat(0x7c00), o, i32x4.gt_s(a, i32x4.splat(0x477fffff)));
  o = v128.or(o, i32x4.shr_u(sign, 16));
  return v128.bitselect(i32x4.splat(0x7e00), o, i32x4.gt_s(a, i32x4.splat(0x7f800000)));
}

