// q8_0 weights against q8_0-quantized activations, in integers (as ggml's q8_0 x q8_0 dot does).
//
// THE Q8 ORDER (q8_0 only; the other dtypes keep THE ORDER in matmul.ts). Each token row x is
// first quantized by quantize_q8_x, once per dispatch, in 32-element blocks: a = max |x_j| of the
// block, scale s = a / 127, q_j = nearest-even(x_j * (s == 0 ? 0 : 1 / s)), saturated to i16
// (every step in f32; q lies in [-127, 127] for finite x). Then
//
//   y = sum over blocks b, in order, of  f32(I_b) * (wscale_b * s_b)
//
// where I_b = sum_j w_j q_j is the block's exact integer dot (|I_b| < 2^24, so f32(I_b) is exact
// and the order inside a block does not matter), wscale_b the weights' f16 scale made f32, every
// product and sum rounded to f32 (WebAssembly never fuses them), starting from 0. One running sum
// per output row: it depends only on the row's weights and its own token row, never on the tile,
// the batch or the thread. matmulQ8Ref in matmul.ts states it in plain JS.
//
// QUANTIZED X: row r at xq + r * qRowBytes(n): the n values as i16 (widened once here, so the
// inner loop is i32x4.dot_i16x8_s against them), then the n / 32 block scales as f32 (f32 rather
// than ggml's f16: this is scratch, not storage, so the extra bytes cost nothing and a rounding
// and a conversion per block go away).
//
// The weights are in matmul.ts's STRIP LAYOUT: a group is one 32-weight block of 8 rows, the 8
// f16 scales (one v128, widened once per group) then the 8 rows' 32 int8.

import { f16ext, f16ToF32 } from "./f16";

/** Rows per strip. */
const S: i32 = 8;
/** Bytes of one group: 8 f16 scales, then 8 rows of 32 int8. */
const GROUP: usize = 272;

/** Bytes of one quantized token row of n (a multiple of 32). */
@inline function qRowBytes(n: i32): usize {
  return (<usize>(2 * n + (n >> 3)) + 15) & ~15;
}

/**
 * rows token rows of n f32 at x into the quantized layout at dst (see QUANTIZED X). n must be a
 * multiple of 32.
 */
export function quantize_q8_x(dst: usize, x: usize, rows: i32, n: i32): void {
  const qb = qRowBytes(n);
  const blocks = n >> 5;
  for (let r = 0; r < rows; r++) {
    const xr = x + <usize>r * (<usize>n << 2);
    const qr = dst + <usize>r * qb;
    const sr = qr + (<usize>n << 1);
    for (let b = 0; b < blocks; b++) quantizeBlock(qr + (<usize>b << 6), sr + (<usize>b << 2), xr + (<usize>b << 7));
  }
}

/** One 32-element block of f32 at xp into 32 i16 at qp and its scale at sp. */
@inline function quantizeBlock(qp: usize, sp: usize, xp: usize): void {
  let m = f32x4.abs(v128.load(xp));
  for (let i: usize = 16; i < 128; i += 16) m = f32x4.max(m, f32x4.abs(v128.load(xp + i)));
  // f32x4.max and max carry a NaN through, so a NaN block gets a NaN scale (and zero values).
  const a = max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3)));
  const s: f32 = a / 127;
  const inv = f32x4.splat(s == 0 ? 0 : <f32>1 / s);
  store<f32>(sp, s);
  for (let i: usize = 0; i < 128; i += 32) {
    const lo = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(xp + i), inv)));
    const hi = i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.mul(v128.load(xp + i, 16), inv)));
    v128.store(qp + (i >> 1), i16x8.narrow_i32x4_s(lo, hi));
  }
}

/** The exact integer dot of 32 int8 weights at w with 32 i16 x (x0..x3, 8 each), as 4 partial i32 lanes. */
@inline function blockDot(w: usize, x0: v128, x1: v128, x2: v128, x3: v128): v128 {
  const a = v128.load(w);
  const b = v128.load(w, 16);
  const s = i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_s(a), x0), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_s(a), x1));
  return i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_s(b), x2), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_s(b), x3)));
}

/** [sum of a's lanes, b's, c's, d's] (exact integers, so any order). */
@inline function sum4(a: v128, b: v128, c: v128, d: v128): v128 {
  const ab = i32x4.add(i32x4.shuffle(a, b, 0, 4, 1, 5), i32x4.shuffle(a, b, 2, 6, 3, 7));
  const cd = i32x4.add(i32x4.shuffle(c, d, 0, 4, 1, 5), i32x4.shuffle(c, d, 2, 6, 3, 7));
  return i32x4.add(i32x4.shuffle(ab, cd, 0, 1, 4, 5), i32x4.shuffle(ab, cd, 2, 3, 6, 7));
}

/** acc + f32(I) * (wscale * xscale), lane by lane (four rows' running sums). */
@inline function addBlock(acc: v128, sums: v128, wscale: v128, xscale: v128): v128 {
  return f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(sums), f32x4.mul(wscale, xscale)));
}

/**
 * The 8 rows of the strip at sp against one quantized token row xq; outputs at yo, yo + 4, ...
 * Each block's x is loaded once for the 8 rows, each row's integer dot reduced with three others
 * so one f32x4 carries four rows' running sums.
 */
@inline function strip8(yo: usize, xq: usize, sp: usize, n: i32): void {
  const blocks = n >> 5;
  let lo = f32x4.splat(0);
  let hi = lo;
  let g = sp;
  let xp = xq;
  let sp4 = xq + (<usize>n << 1);
  for (let c = 0; c < blocks; c++) {
    const x0 = v128.load(xp), x1 = v128.load(xp, 16), x2 = v128.load(xp, 32), x3 = v128.load(xp, 48);
    const xs = v128.load32_splat(sp4);
    const ws = v128.load(g);
    const w = g + 16;
    const s0 = sum4(blockDot(w, x0, x1, x2, x3), blockDot(w + 32, x0, x1, x2, x3), blockDot(w + 64, x0, x1, x2, x3), blockDot(w + 96, x0, x1, x2, x3));
    lo = addBlock(lo, s0, f16ext(i32x4.extend_low_i16x8_s(ws)), xs);
    const s1 = sum4(blockDot(w + 128, x0, x1, x2, x3), blockDot(w + 160, x0, x1, x2, x3), blockDot(w + 192, x0, x1, x2, x3), blockDot(w + 224, x0, x1, x2, x3));
    hi = addBlock(hi, s1, f16ext(i32x4.extend_high_i16x8_s(ws)), xs);
    g += GROUP;
    xp += 64;
    sp4 += 4;
  }
  v128.store(yo, lo);
  v128.store(yo, hi, 16);
}

/** Row k of the strip at sp against one quantized token row xq (the same sum as strip8's). */
@inline function row1(xq: usize, sp: usize, k: i32, n: i32): f32 {
  const blocks = n >> 5;
  let acc: f32 = 0;
  let g = sp;
  let xp = xq;
  let sp4 = xq + (<usize>n << 1);
  for (let c = 0; c < blocks; c++) {
    const p = blockDot(g + 16 + (<usize>k << 5), v128.load(xp), v128.load(xp, 16), v128.load(xp, 32), v128.load(xp, 48));
    const i = i32x4.extract_lane(p, 0) + i32x4.extract_lane(p, 1) + (i32x4.extract_lane(p, 2) + i32x4.extract_lane(p, 3));
    acc += <f32>i * (f16ToF32(<u32>load<u16>(g + (<usize>k << 1))) * load<f32>(sp4));
    g += GROUP;
    xp += 64;
    sp4 += 4;
  }
  return acc;
}

/**
 * Rows g0 .. g1 of the q8_0 matrix at w (a thread's share) against every quantized token row at
 * xq; row g's outputs go to column g - r0 of y. Rows of a strip not wholly in the range go one at
 * a time. n must be a multiple of 32 (the caller checks).
 */
export function matmul_q8_0(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  const sb = <usize>(n >> 5) * GROUP;
  const qb = qRowBytes(n);
  const ys = <usize>d << 2;
  let g = g0;
  for (; g < g1 && ((g & (S - 1)) != 0 || g + S > g1); g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1(xq + <usize>r * qb, sp, g & (S - 1), n));
  }
  for (; g + S <= g1; g += S) {
    const sp = w + <usize>(g >> 3) * sb;
    const yo = y + (<usize>(g - r0) << 2);
    for (let r = 0; r < rows; r++) strip8(yo + <usize>r * ys, xq + <usize>r * qb, sp, n);
  }
  for (; g < g1; g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1(xq + <usize>r * qb, sp, g & (S - 1), n));
  }
}
