// q4_0, q4_1, q5_0 and q5_1 weights (ggml's 32-weight blocks) against x quantized as for q8_0
// (q8.ts's QUANTIZED X: per 32-block i16 values q_j, an f32 scale s_b and the sum X_b of q), in
// integers.
//
// THE LEGACY ORDER. Per output, one running f32 sum from 0 over the 32-blocks in order:
//   q4_0, q5_0:  acc = acc + f32(I) * (d * s_b)
//   q4_1, q5_1:  acc = acc + (f32(I) * (d * s_b) + f32(X_b) * (m * s_b))
// with I = sum_j u_j q_j + offset * X_b, u_j the unsigned weights (the nibble, with q5's fifth
// bit as 16), offset -8 (q4_0), -16 (q5_0) or 0 (the _1 types), d and m the block's f16 values
// made f32. I and X_b are exact integers (|I| < 2^26 even when x saturates to i16), each product
// and sum rounded to f32. Per output row only, as THE Q8 ORDER: matmulLegacyRef in matmul.ts
// states it in plain JS on ggml's blocks.
//
// THE LEGACY STRIP LAYOUT (legacy-strips.ts packs it): a strip of 8 rows is a group per 32-block:
// the 8 rows' d (f16, 16 bytes), the _1 types' 8 m (16 bytes), then the nibbles of each half
// strip (64 bytes each: 4 quads of 16 bytes, byte b of quad u holding e = 32u + b low and
// e = 32u + 16 + b high, e as kquants.ts's pairs of columns of four rows), then for the q5 types
// each half's fifth bits (16 bytes: bit t of byte b is e = 16t + b, as q5_k's: each or-ed into
// its nibble as kquants.ts does). 144, 160, 176 and 192 bytes
// a group: 4.5, 5, 5.5 and 6 bits a weight, ggml's own.

import { f16ext } from "./f16";
import { bit0to4, bit1to4, highNibble, next2, q4Dot } from "./kquants";
import { scalesOf, sumsOf } from "./q8";

/** Bytes of one quantized token row of n (q8.ts's qRowBytes, restated: the two must agree). */
@inline function qRowBytes(n: i32): usize {
  return (<usize>(8 * n + (n >> 2)) + 15) & ~15;
}

@inline function groupBytes(min: bool, five: bool): usize {
  return 144 + (min ? 16 : 0) + (five ? 32 : 0);
}

/** Four f16 at p made f32x4. */
@inline function f16at(p: usize): v128 {
  return f16ext(i32x4.extend_low_i16x8_s(v128.load64_zero(p)));
}

/**
 * sum_j u_j q_j of one half strip's block (4 rows in lanes) against one token's 16 splatted
 * pairs at xp: nib its 64 nibble bytes, bits its 16 fifth-bit bytes (five only). The nibble
 * quads and the fifth-bit plane are laid out as q4_k's and q5_k's sub-blocks (bit t of byte b
 * is e = 16t + b), so this is kquants.ts's sub-block dot.
 */
@inline function halfDot(five: bool, nib: usize, bits: usize, xp: usize): v128 {
  return q4Dot(five, nib, five ? v128.load(bits) : i32x4.splat(0), xp);
}

/** A half strip (rows 4 * half ..) of the matrix at sp against one quantized token row xq. */
@inline function half1(min: bool, five: bool, offset: i32, xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + half * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + half * 16;
  const sr = scalesOf(xq, n);
  const ur = sumsOf(xq, n);
  let acc = f32x4.splat(0);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * gb;
    const xs = load<i32>(ur + (<usize>c << 2));
    let i = halfDot(five, g + nib0, g + bits0, xq + (<usize>c << 8));
    if (offset != 0) i = i32x4.add(i, i32x4.splat(offset * xs));
    const s = f32x4.splat(load<f32>(sr + (<usize>c << 2)));
    let t = f32x4.mul(f32x4.convert_i32x4_s(i), f32x4.mul(f16at(g + (half << 3)), s));
    if (min) t = f32x4.add(t, f32x4.mul(f32x4.convert_i32x4_s(i32x4.splat(xs)), f32x4.mul(f16at(g + 16 + (half << 3)), s)));
    acc = f32x4.add(acc, t);
  }
  return acc;
}

/**
 * A half strip against four token rows from xq (qb apart), outputs of token t at yo + t * ys:
 * each quad of nibbles (and each fifth bit) is unpacked once for the four tokens. y holds the
 * running f32 sums (the same additions, in the same order, as half1's registers).
 */
@inline function half4(min: bool, five: bool, offset: i32, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + half * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + half * 16;
  const sr = scalesOf(xq, n);
  const ur = sumsOf(xq, n);
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < 4; t++) v128.store(yo + t * ys, z);
  const m = i8x16.splat(0x0f);
  const mh = i8x16.splat(<i8>0xf0);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * gb;
    const xb = xq + (<usize>c << 8);
    let l0 = i32x4.splat(0), l1 = l0, l2 = l0, l3 = l0;
    let h0 = l0, h1 = l0, h2 = l0, h3 = l0;
    // The fifth bits or-ed into the nibbles as kquants.ts's q5_k does (the same plane layout).
    let hb = five ? v128.load(g + bits0) : i32x4.splat(0);
    for (let u: usize = 0; u < 64; u += 16) {
      const v = v128.load(g + nib0 + u);
      const lo = five ? v128.or(v128.and(v, m), bit0to4(hb)) : v128.and(v, m);
      const hi = five ? v128.or(highNibble(v), bit1to4(hb)) : v128.and(v, mh);
      if (five) hb = next2(hb);
      const p0 = i16x8.extend_low_i8x16_u(lo);
      const p1 = i16x8.extend_high_i8x16_u(lo);
      const p2 = i16x8.extend_low_i8x16_u(hi);
      const p3 = i16x8.extend_high_i8x16_u(hi);
      let x = xb + (u << 2);
      l0 = i32x4.add(l0, i32x4.add(i32x4.dot_i16x8_s(p0, v128.load(x)), i32x4.dot_i16x8_s(p1, v128.load(x, 16))));
      h0 = i32x4.add(h0, i32x4.add(i32x4.dot_i16x8_s(p2, v128.load(x, 32)), i32x4.dot_i16x8_s(p3, v128.load(x, 48))));
      x += qb;
      l1 = i32x4.add(l1, i32x4.add(i32x4.dot_i16x8_s(p0, v128.load(x)), i32x4.dot_i16x8_s(p1, v128.load(x, 16))));
      h1 = i32x4.add(h1, i32x4.add(i32x4.dot_i16x8_s(p2, v128.load(x, 32)), i32x4.dot_i16x8_s(p3, v128.load(x, 48))));
      x += qb;
      l2 = i32x4.add(l2, i32x4.add(i32x4.dot_i16x8_s(p0, v128.load(x)), i32x4.dot_i16x8_s(p1, v128.load(x, 16))));
      h2 = i32x4.add(h2, i32x4.add(i32x4.dot_i16x8_s(p2, v128.load(x, 32)), i32x4.dot_i16x8_s(p3, v128.load(x, 48))));
      x += qb;
      l3 = i32x4.add(l3, i32x4.add(i32x4.dot_i16x8_s(p0, v128.load(x)), i32x4.dot_i16x8_s(p1, v128.load(x, 16))));
      h3 = i32x4.add(h3, i32x4.add(i32x4.dot_i16x8_s(p2, v128.load(x, 32)), i32x4.dot_i16x8_s(p3, v128.load(x, 48))));
    }
    // Without fifth bits the high nibbles were taken times 16.
    l0 = i32x4.add(l0, five ? h0 : i32x4.shr_s(h0, 4));
    l1 = i32x4.add(l1, five ? h1 : i32x4.shr_s(h1, 4));
    l2 = i32x4.add(l2, five ? h2 : i32x4.shr_s(h2, 4));
    l3 = i32x4.add(l3, five ? h3 : i32x4.shr_s(h3, 4));
    const dq = f16at(g + (half << 3));
    const dm = min ? f16at(g + 16 + (half << 3)) : dq;
    const cs = <usize>c << 2;
    finish(min, offset, yo, l0, dq, dm, sr + cs, ur + cs);
    finish(min, offset, yo + ys, l1, dq, dm, sr + qb + cs, ur + qb + cs);
    finish(min, offset, yo + 2 * ys, l2, dq, dm, sr + 2 * qb + cs, ur + 2 * qb + cs);
    finish(min, offset, yo + 3 * ys, l3, dq, dm, sr + 3 * qb + cs, ur + 3 * qb + cs);
  }
}

/** y at yo += one block's term for one token (as half1's): its scale at sp, its sum at up. */
@inline function finish(min: bool, offset: i32, yo: usize, i: v128, dq: v128, dm: v128, sp: usize, up: usize): void {
  const xs = load<i32>(up);
  if (offset != 0) i = i32x4.add(i, i32x4.splat(offset * xs));
  const s = f32x4.splat(load<f32>(sp));
  let t = f32x4.mul(f32x4.convert_i32x4_s(i), f32x4.mul(dq, s));
  if (min) t = f32x4.add(t, f32x4.mul(f32x4.convert_i32x4_s(i32x4.splat(xs)), f32x4.mul(dm, s)));
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

/**
 * Rows g0 .. g1 of the matrix at w (a thread's share) against every quantized token row at xq;
 * row g's outputs go to column g - r0 of y. Whole strips take four tokens at a time per half
 * strip (half4), then one at a time both halves; a row of a strip not wholly in the range
 * computes its half and keeps its lane (the same sum).
 */
@inline function matmulLegacy(min: bool, five: bool, offset: i32, y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32): void {
  const sb = <usize>(n >> 5) * groupBytes(min, five);
  const qb = qRowBytes(n);
  const ys = <usize>d << 2;
  for (let g = g0; g < g1; ) {
    const sp = w + <usize>(g >> 3) * sb;
    if ((g & 7) == 0 && g + 8 <= g1) {
      let r = 0;
      for (; r + 4 <= rows; r += 4) {
        const yr = y + <usize>r * ys + (<usize>(g - r0) << 2);
        const xr = xq + <usize>r * qb;
        half4(min, five, offset, yr, ys, xr, qb, sp, 0, n);
        half4(min, five, offset, yr + 16, ys, xr, qb, sp, 1, n);
      }
      for (; r < rows; r++) {
        const yr = y + <usize>r * ys + (<usize>(g - r0) << 2);
        const xr = xq + <usize>r * qb;
        v128.store(yr, half1(min, five, offset, xr, sp, 0, n));
        v128.store(yr, half1(min, five, offset, xr, sp, 1, n), 16);
      }
      g += 8;
      continue;
    }
    const lane = g & 3;
    for (let r = 0; r < rows; r++) {
      const v = half1(min, five, offset, xq + <usize>r * qb, sp, <usize>((g >> 2) & 1), n);
      const o = y + <usize>r * ys + (<usize>(g - r0) << 2);
      if (lane == 0) store<f32>(o, f32x4.extract_lane(v, 0));
      else if (lane == 1) store<f32>(o, f32x4.extract_lane(v, 1));
      else if (lane == 2) store<f32>(o, f32x4.extract_lane(v, 2));
      else store<f32>(o, f32x4.extract_lane(v, 3));
    }
    g++;
  }
}

export function matmul_q4_0(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(false, false, -8, y, xq, w, rows, n, d, r0, g0, g1);
}

export function matmul_q4_1(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(true, false, 0, y, xq, w, rows, n, d, r0, g0, g1);
}

export function matmul_q5_0(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(false, true, -16, y, xq, w, rows, n, d, r0, g0, g1);
}

export function matmul_q5_1(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(true, true, 0, y, xq, w, rows, n, d, r0, g0, g1);
}
