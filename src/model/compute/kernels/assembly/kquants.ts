// q4_k and q6_k weights (ggml's K-quants, 256-weight super-blocks) against activations quantized
// per super-block to 8 bits, in integers (as ggml's vec_dot_q4_K_q8_K and vec_dot_q6_K_q8_K do).
//
// QUANTIZED X (quantize_k_x, once per dispatch per x): each token row, per 256-element
// super-block b: a = max |x_j|, s_b = a / 127, q_j = nearest-even(min(max(x_j * (s_b == 0 ? 0 :
// 1 / s_b), -127), 127)) (a NaN gives 0; every step in f32), so |q_j| <= 127 always. Row layout:
// the values as i16, each pair (j, j + 1) splatted over a v128 (16 bytes a pair, as q8.ts), then
// the n / 256 scales s_b as f32, then the n / 16 sums of q over each 16 elements as i32.
//
// THE K ORDER. Per output (weight row, token row), one running f32 sum from 0 over the
// super-blocks in order:
//   q4_k:  acc = acc + (f32(A) * (d * s_b) - f32(B) * (dmin * s_b)),
//          A = sum_j sc_j * (sum_i q_i x_i),  B = sum_j m_j * (sum_i x_i)  over the 8 sub-blocks j
//          of 32 (q the 4-bit weights 0..15, sc and m the 6-bit scales and mins, x the quantized
//          activations), d and dmin the block's f16 values made f32;
//   q5_k:  as q4_k, q the 5-bit weights 0..31;
//   q6_k:  acc = acc + f32(A) * (d * s_b),
//          A = sum_k sc_k * (sum_i q_i x_i - 32 * sum_i x_i)  over the 16 sub-blocks k of 16
//          (q the 6-bit weights 0..63, sc the int8 scales).
// A and B are exact integers (q4_k |A| < 2^25, |B| < 2^21; q6_k |A| < 2^28: bounded by the ranges above),
// so the order inside a super-block does not matter; f32(A) rounds to nearest even like JS's
// Math.fround; every product and sum is rounded to f32 (WebAssembly never fuses them). The sum
// depends only on the weight row and its own token row: never on the tile, the batch or the
// thread. matmulQ4KRef and matmulQ6KRef (k-quant-ref.ts) state it in plain JS on ggml's blocks.
//
// THE K STRIP LAYOUT (k-quant-strips.ts packs it): rows in strips of 8, each strip a group per
// super-block, a group holding its 8 rows' super-blocks. Within a sub-block the 4 rows of a half
// strip (rows 0..3, 4..7) are interleaved in pairs as q8.ts's: element (row k, column i) is
// e = (i >> 1) * 8 + k * 2 + (i & 1), so 8 consecutive e are one pair of columns of four rows,
// which i32x4.dot_i16x8_s takes against x's splatted pair into four rows' lanes.
//   q4_k group (1184 bytes): d of rows 0..7 (f16), dmin of rows 0..7 (f16), scales as u8 at
//     32 + half * 32 + j * 4 + k, mins likewise at 96, then the nibbles at 160 + half * 512 +
//     j * 64: 4 quads of 16 bytes, byte b of quad u holding e = 32u + b low and e = 32u + 16 + b
//     high. (The 6-bit scales and mins are unpacked to bytes: 4.625 bits a weight where ggml's
//     block is 4.5.)
//   q6_k group (1680 bytes): d of rows 0..7 (f16), scales as i8 at 16 + half * 64 + k * 4 + row,
//     then per half and sub-block a unit of 48 bytes at 144 + half * 768 + k * 48: bytes n0, n1
//     (16 each) and h (16). The 64 e of a unit: e = b in the low nibble of n0[b] and bits 4..5 of
//     h[b]; e = 16 + b in the high nibble of n0[b], bits 2..3 of h[b]; e = 32 + b low nibble of
//     n1[b], bits 0..1; e = 48 + b high nibble of n1[b], bits 6..7. (6.5625 bits a weight, as
//     ggml's.) The places of the high bits let each come out with an and, a 16-bit multiply (a
//     left shift) or a rounding 16-bit multiply (a right shift): no vector shift runs in a loop.
//   q5_k group (1440 bytes): q4_k's, then the fifth bits at 1184 + half * 128 + j * 16: bit t of
//     byte b is e = 16t + b, so quad u's low nibbles take bit 2u and its high ones bit 2u + 1,
//     each moved to bit 4 and or-ed in (the plane moving down 2 bits a quad): the kernel reads
//     5-bit values 0..31.

import { f16ext, f16ToF32 } from "./f16";

export const Q4K_GROUP: usize = 1184;
export const Q5K_GROUP: usize = 1440;
export const Q6K_GROUP: usize = 1680;

/** Bytes of one quantized token row of n (a multiple of 256). */
@inline function kRowBytes(n: i32): usize {
  return (<usize>(8 * n + (n >> 6) + (n >> 2)) + 15) & ~15;
}

export function k_row_bytes(n: i32): i32 {
  return <i32>kRowBytes(n);
}

@inline function scalesAt(xq: usize, n: i32): usize {
  return xq + (<usize>n << 3);
}

@inline function sumsAt(xq: usize, n: i32): usize {
  return xq + (<usize>n << 3) + (<usize>(n >> 8) << 2);
}

/** rows token rows of n f32 at x into the quantized layout at dst (see QUANTIZED X); n % 256 == 0. */
export function quantize_k_x(dst: usize, x: usize, rows: i32, n: i32): void {
  const qb = kRowBytes(n);
  const blocks = n >> 8;
  const lim = f32x4.splat(127);
  const nlim = f32x4.splat(-127);
  for (let r = 0; r < rows; r++) {
    const xr = x + <usize>r * (<usize>n << 2);
    const qr = dst + <usize>r * qb;
    const sr = scalesAt(qr, n);
    const ur = sumsAt(qr, n);
    for (let b = 0; b < blocks; b++) {
      const xp = xr + (<usize>b << 10);
      let m = f32x4.abs(v128.load(xp));
      for (let i: usize = 16; i < 1024; i += 16) m = f32x4.max(m, f32x4.abs(v128.load(xp + i)));
      const a = max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3)));
      const s: f32 = a / 127;
      const inv = f32x4.splat(s == 0 ? 0 : <f32>1 / s);
      store<f32>(sr + (<usize>b << 2), s);
      // 16 elements (64 bytes of x) per step: one sum each.
      for (let i: usize = 0; i < 1024; i += 64) {
        const q0 = quant4(v128.load(xp + i), inv, lim, nlim);
        const q1 = quant4(v128.load(xp + i, 16), inv, lim, nlim);
        const q2 = quant4(v128.load(xp + i, 32), inv, lim, nlim);
        const q3 = quant4(v128.load(xp + i, 48), inv, lim, nlim);
        const t = i32x4.add(i32x4.add(q0, q1), i32x4.add(q2, q3));
        const sum = i32x4.extract_lane(t, 0) + i32x4.extract_lane(t, 1) + i32x4.extract_lane(t, 2) + i32x4.extract_lane(t, 3);
        store<i32>(ur + (<usize>b << 6) + (i >> 4), sum);
        const lo = i16x8.narrow_i32x4_s(q0, q1);
        const hi = i16x8.narrow_i32x4_s(q2, q3);
        const o = qr + (<usize>b << 11) + (i << 1);
        v128.store(o, i32x4.shuffle(lo, lo, 0, 0, 0, 0));
        v128.store(o, i32x4.shuffle(lo, lo, 1, 1, 1, 1), 16);
        v128.store(o, i32x4.shuffle(lo, lo, 2, 2, 2, 2), 32);
        v128.store(o, i32x4.shuffle(lo, lo, 3, 3, 3, 3), 48);
        v128.store(o, i32x4.shuffle(hi, hi, 0, 0, 0, 0), 64);
        v128.store(o, i32x4.shuffle(hi, hi, 1, 1, 1, 1), 80);
        v128.store(o, i32x4.shuffle(hi, hi, 2, 2, 2, 2), 96);
        v128.store(o, i32x4.shuffle(hi, hi, 3, 3, 3, 3), 112);
      }
    }
  }
}

/** Four f32 to i32 q: x * inv clamped to [-127, 127], nearest-even; NaN to 0. */
@inline function quant4(v: v128, inv: v128, lim: v128, nlim: v128): v128 {
  return i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.min(f32x4.max(f32x4.mul(v, inv), nlim), lim)));
}

/** 4 bytes at p (u8) widened to i32x4. */
@inline function u8x4(p: usize): v128 {
  return i32x4.extend_low_i16x8_u(i16x8.extend_low_i8x16_u(v128.load32_zero(p)));
}

/** 4 bytes at p (i8) widened to i32x4. */
@inline function i8x4(p: usize): v128 {
  return i32x4.extend_low_i16x8_s(i16x8.extend_low_i8x16_s(v128.load32_zero(p)));
}

/** Four f16 at p made f32x4. */
@inline function f16at(p: usize): v128 {
  return f16ext(i32x4.extend_low_i16x8_s(v128.load64_zero(p)));
}

// ---------------------------------------------------------------------------------------- q4_k

/**
 * One sub-block's integer dots of a half strip (4 rows in lanes) against one token: wq its 64
 * nibble bytes, xj the token's 16 splatted pairs of the sub-block. The high nibbles are taken
 * times 16 (an and, no shift) into their own sums, divided once at the end (exact).
 */
@inline export function q4Dot(five: bool, wq: usize, hb: v128, xj: usize): v128 {
  const m = i8x16.splat(0x0f);
  const mh = i8x16.splat(<i8>0xf0);
  let il = i32x4.splat(0);
  let ih = il;
  let h = hb;
  for (let u: usize = 0; u < 64; u += 16) {
    const v = v128.load(wq + u);
    // q5_k: the fifth bits of quad u are bits 2u (low nibbles) and 2u + 1 (high) of hb: h holds
    // them at bits 0 and 1 (moved down 2 a quad), each set in as 16.
    const lo = five ? v128.or(v128.and(v, m), bit0to4(h)) : v128.and(v, m);
    const hi = five ? v128.or(highNibble(v), bit1to4(h)) : v128.and(v, mh);
    if (five) h = next2(h);
    const x = xj + (u << 2);
    il = i32x4.add(il, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(lo), v128.load(x)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(lo), v128.load(x, 16))));
    ih = i32x4.add(ih, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(hi), v128.load(x, 32)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(hi), v128.load(x, 48))));
  }
  return i32x4.add(il, five ? ih : i32x4.shr_s(ih, 4));
}

/** Bits 0 (lo) and 1 (hi) of each byte of h moved to bit 4 (a value of 16), by 16-bit multiplies (no shift). */
@inline export function bit0to4(h: v128): v128 {
  return v128.and(i16x8.mul(h, i16x8.splat(16)), i8x16.splat(0x10));
}

@inline export function bit1to4(h: v128): v128 {
  return v128.and(i16x8.mul(h, i16x8.splat(8)), i8x16.splat(0x10));
}

/** Each byte of h shifted right by 2 (its bits 2..7 to 0..5), by a rounding 16-bit multiply of the masked bytes. */
@inline export function next2(h: v128): v128 {
  return v128.and(i16x8.q15mulr_sat_s(v128.and(h, i8x16.splat(<i8>0xfc)), i16x8.splat(8192)), i8x16.splat(0x3f));
}

/** The high nibble of each byte of v as a value 0..15 (and, rounding multiply, and: no shift). */
@inline export function highNibble(v: v128): v128 {
  return v128.and(i16x8.q15mulr_sat_s(v128.and(v, i8x16.splat(<i8>0xf0)), i16x8.splat(2048)), i8x16.splat(0x0f));
}

/** A half strip's q4_k (q5_k when five) super-block sum term for one token: f32(A) * (d * s) - f32(B) * (dmin * s). */
@inline function q4Term(five: bool, g: usize, half: usize, xb: usize, s: f32, sums: usize): v128 {
  let a = i32x4.splat(0);
  let b = a;
  const wq = g + 160 + half * 512;
  const sc = g + 32 + half * 32;
  const mn = g + 96 + half * 32;
  const bits = g + Q4K_GROUP + half * 128;
  for (let j: usize = 0; j < 8; j++) {
    const hb = five ? v128.load(bits + j * 16) : i32x4.splat(0);
    a = i32x4.add(a, i32x4.mul(q4Dot(five, wq + j * 64, hb, xb + (j << 8)), u8x4(sc + (j << 2))));
    const xs = load<i32>(sums + (j << 3)) + load<i32>(sums + (j << 3), 4);
    b = i32x4.add(b, i32x4.mul(u8x4(mn + (j << 2)), i32x4.splat(xs)));
  }
  const sv = f32x4.splat(s);
  const dv = f32x4.mul(f16at(g + (half << 3)), sv);
  const mv = f32x4.mul(f16at(g + 16 + (half << 3)), sv);
  return f32x4.sub(f32x4.mul(f32x4.convert_i32x4_s(a), dv), f32x4.mul(f32x4.convert_i32x4_s(b), mv));
}

/** A half strip (rows 4 * half ..) of q4_k (q5_k when five) at sp against one quantized token row xq. */
@inline function q4Half1(five: bool, xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 8;
  let acc = f32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sumsAt(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * (five ? Q5K_GROUP : Q4K_GROUP);
    acc = f32x4.add(acc, q4Term(five, g, half, xq + (<usize>c << 11), load<f32>(sr + (<usize>c << 2)), ur + (<usize>c << 6)));
  }
  return acc;
}

/**
 * A half strip of q4_k against four token rows from xq (qb apart), outputs of token t at
 * yo + t * ys: each quad of nibbles is unpacked once for the four tokens. The integer sums of a
 * sub-block stay in registers; the super-block's A per token is kept in `scratch` (16 bytes a
 * token), and y holds the running f32 sums (the same additions as in registers).
 */
@inline function q4Half4(five: bool, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const blocks = n >> 8;
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < 4; t++) v128.store(yo + t * ys, z);
  const m = i8x16.splat(0x0f);
  const mh = i8x16.splat(<i8>0xf0);
  const sr = scalesAt(xq, n);
  const ur = sumsAt(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * (five ? Q5K_GROUP : Q4K_GROUP);
    const wq = g + 160 + half * 512;
    const sc = g + 32 + half * 32;
    const mn = g + 96 + half * 32;
    const bits = g + Q4K_GROUP + half * 128;
    const xb = xq + (<usize>c << 11);
    let a0 = i32x4.splat(0), a1 = a0, a2 = a0, a3 = a0;
    for (let j: usize = 0; j < 8; j++) {
      let l0 = i32x4.splat(0), l1 = l0, l2 = l0, l3 = l0;
      let h0 = l0, h1 = l0, h2 = l0, h3 = l0;
      const w = wq + j * 64;
      const xj = xb + (j << 8);
      let h = five ? v128.load(bits + j * 16) : i32x4.splat(0);
      for (let u: usize = 0; u < 64; u += 16) {
        const v = v128.load(w + u);
        const lo = five ? v128.or(v128.and(v, m), bit0to4(h)) : v128.and(v, m);
        const hi = five ? v128.or(highNibble(v), bit1to4(h)) : v128.and(v, mh);
        if (five) h = next2(h);
        const p0 = i16x8.extend_low_i8x16_u(lo);
        const p1 = i16x8.extend_high_i8x16_u(lo);
        const p2 = i16x8.extend_low_i8x16_u(hi);
        const p3 = i16x8.extend_high_i8x16_u(hi);
        let x = xj + (u << 2);
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
      const scv = u8x4(sc + (j << 2));
      // q4_k's high nibbles were taken times 16; q5_k's as they are.
      a0 = i32x4.add(a0, i32x4.mul(i32x4.add(l0, five ? h0 : i32x4.shr_s(h0, 4)), scv));
      a1 = i32x4.add(a1, i32x4.mul(i32x4.add(l1, five ? h1 : i32x4.shr_s(h1, 4)), scv));
      a2 = i32x4.add(a2, i32x4.mul(i32x4.add(l2, five ? h2 : i32x4.shr_s(h2, 4)), scv));
      a3 = i32x4.add(a3, i32x4.mul(i32x4.add(l3, five ? h3 : i32x4.shr_s(h3, 4)), scv));
    }
    const dq = f16at(g + (half << 3));
    const dm = f16at(g + 16 + (half << 3));
    q4Finish(yo, a0, dq, dm, mn, sr + (<usize>c << 2), ur + (<usize>c << 6));
    q4Finish(yo + ys, a1, dq, dm, mn, sr + qb + (<usize>c << 2), ur + qb + (<usize>c << 6));
    q4Finish(yo + 2 * ys, a2, dq, dm, mn, sr + 2 * qb + (<usize>c << 2), ur + 2 * qb + (<usize>c << 6));
    q4Finish(yo + 3 * ys, a3, dq, dm, mn, sr + 3 * qb + (<usize>c << 2), ur + 3 * qb + (<usize>c << 6));
  }
}

/** y at yo += f32(a) * (d * s) - f32(B) * (dmin * s) for one token (B from its sums), as q4Term. */
@inline function q4Finish(yo: usize, a: v128, dq: v128, dm: v128, mn: usize, sp: usize, sums: usize): void {
  let b = i32x4.splat(0);
  for (let j: usize = 0; j < 8; j++) {
    const xs = load<i32>(sums + (j << 3)) + load<i32>(sums + (j << 3), 4);
    b = i32x4.add(b, i32x4.mul(u8x4(mn + (j << 2)), i32x4.splat(xs)));
  }
  const sv = f32x4.splat(load<f32>(sp));
  const t = f32x4.sub(f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(dq, sv)), f32x4.mul(f32x4.convert_i32x4_s(b), f32x4.mul(dm, sv)));
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

// ---------------------------------------------------------------------------------------- q6_k

/**
 * One sub-block unit's integer dot sum q_i x_i (q 0..63) of a half strip against one token:
 * u the 48-byte unit, xk the token's 8 splatted pairs of the sub-block.
 */
@inline function q6Dot(u: usize, xk: usize): v128 {
  const n0 = v128.load(u);
  const n1 = v128.load(u, 16);
  const h = v128.load(u, 32);
  const m = i8x16.splat(0x0f);
  const mh = i8x16.splat(<i8>0xf0);
  const m2 = i8x16.splat(0x30);
  const t0 = v128.or(v128.and(n0, m), v128.and(h, m2));
  const t1 = v128.or(v128.and(i16x8.q15mulr_sat_s(v128.and(n0, mh), i16x8.splat(2048)), m), v128.and(i16x8.mul(h, i16x8.splat(4)), m2));
  const t2 = v128.or(v128.and(n1, m), v128.and(i16x8.mul(h, i16x8.splat(16)), m2));
  const t3 = v128.or(v128.and(i16x8.q15mulr_sat_s(v128.and(n1, mh), i16x8.splat(2048)), m), v128.and(i16x8.q15mulr_sat_s(v128.and(h, i8x16.splat(<i8>0xc0)), i16x8.splat(8192)), m2));
  let s = i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t0), v128.load(xk)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t0), v128.load(xk, 16)));
  s = i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t1), v128.load(xk, 32)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t1), v128.load(xk, 48))));
  s = i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t2), v128.load(xk, 64)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t2), v128.load(xk, 80))));
  return i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t3), v128.load(xk, 96)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t3), v128.load(xk, 112))));
}

/** A half strip's q6_k super-block sum term for one token: f32(A) * (d * s). */
@inline function q6Term(g: usize, half: usize, xb: usize, s: f32, sums: usize): v128 {
  let a = i32x4.splat(0);
  const units = g + 144 + half * 768;
  const sc = g + 16 + half * 64;
  for (let k: usize = 0; k < 16; k++) {
    const i = i32x4.sub(q6Dot(units + k * 48, xb + (k << 7)), i32x4.splat(load<i32>(sums + (k << 2)) << 5));
    a = i32x4.add(a, i32x4.mul(i, i8x4(sc + (k << 2))));
  }
  return f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(f16at(g + (half << 3)), f32x4.splat(s)));
}

@inline function q6Half1(xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 8;
  let acc = f32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sumsAt(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * Q6K_GROUP;
    acc = f32x4.add(acc, q6Term(g, half, xq + (<usize>c << 11), load<f32>(sr + (<usize>c << 2)), ur + (<usize>c << 6)));
  }
  return acc;
}

/**
 * A half strip of q6_k against four token rows (as q4Half4): each unit unpacked once for the
 * four tokens.
 */
@inline function q6Half4(yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const blocks = n >> 8;
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < 4; t++) v128.store(yo + t * ys, z);
  const m = i8x16.splat(0x0f);
  const mh = i8x16.splat(<i8>0xf0);
  const m2 = i8x16.splat(0x30);
  const sr = scalesAt(xq, n);
  const ur = sumsAt(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * Q6K_GROUP;
    const units = g + 144 + half * 768;
    const sc = g + 16 + half * 64;
    const xb = xq + (<usize>c << 11);
    const ub = ur + (<usize>c << 6);
    let a0 = i32x4.splat(0), a1 = a0, a2 = a0, a3 = a0;
    for (let k: usize = 0; k < 16; k++) {
      const u = units + k * 48;
      const n0 = v128.load(u);
      const n1 = v128.load(u, 16);
      const h = v128.load(u, 32);
      const t0 = v128.or(v128.and(n0, m), v128.and(h, m2));
      const t1 = v128.or(v128.and(i16x8.q15mulr_sat_s(v128.and(n0, mh), i16x8.splat(2048)), m), v128.and(i16x8.mul(h, i16x8.splat(4)), m2));
      const t2 = v128.or(v128.and(n1, m), v128.and(i16x8.mul(h, i16x8.splat(16)), m2));
      const t3 = v128.or(v128.and(i16x8.q15mulr_sat_s(v128.and(n1, mh), i16x8.splat(2048)), m), v128.and(i16x8.q15mulr_sat_s(v128.and(h, i8x16.splat(<i8>0xc0)), i16x8.splat(8192)), m2));
      const scv = i8x4(sc + (k << 2));
      const xk = xb + (k << 7);
      a0 = q6Acc(a0, t0, t1, t2, t3, xk, ub + (k << 2), scv);
      a1 = q6Acc(a1, t0, t1, t2, t3, xk + qb, ub + qb + (k << 2), scv);
      a2 = q6Acc(a2, t0, t1, t2, t3, xk + 2 * qb, ub + 2 * qb + (k << 2), scv);
      a3 = q6Acc(a3, t0, t1, t2, t3, xk + 3 * qb, ub + 3 * qb + (k << 2), scv);
    }
    const dq = f16at(g + (half << 3));
    q6Finish(yo, a0, dq, sr + (<usize>c << 2));
    q6Finish(yo + ys, a1, dq, sr + qb + (<usize>c << 2));
    q6Finish(yo + 2 * ys, a2, dq, sr + 2 * qb + (<usize>c << 2));
    q6Finish(yo + 3 * ys, a3, dq, sr + 3 * qb + (<usize>c << 2));
  }
}

/** a + sc * (sum q x - 32 * sum x) for one token's sub-block (unpacked t0..t3 against xk, its sum at us). */
@inline function q6Acc(a: v128, t0: v128, t1: v128, t2: v128, t3: v128, xk: usize, us: usize, scv: v128): v128 {
  let s = i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t0), v128.load(xk)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t0), v128.load(xk, 16)));
  s = i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t1), v128.load(xk, 32)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t1), v128.load(xk, 48))));
  s = i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t2), v128.load(xk, 64)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t2), v128.load(xk, 80))));
  s = i32x4.add(s, i32x4.add(i32x4.dot_i16x8_s(i16x8.extend_low_i8x16_u(t3), v128.load(xk, 96)), i32x4.dot_i16x8_s(i16x8.extend_high_i8x16_u(t3), v128.load(xk, 112))));
  return i32x4.add(a, i32x4.mul(i32x4.sub(s, i32x4.splat(load<i32>(us) << 5)), scv));
}

@inline function q6Finish(yo: usize, a: v128, dq: v128, sp: usize): void {
  const t = f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(dq, f32x4.splat(load<f32>(sp))));
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

// ------------------------------------------------------------------------------------ dispatch

/**
 * Rows g0 .. g1 of the matrix at w (q4_k when six is false, else q6_k; a thread's share) against
 * every quantized token row at xq; row g's outputs go to column g - r0 of y. Whole strips take
 * four tokens at a time per half strip, then one at a time both halves; a row of a strip not
 * wholly in the range computes its half alone and keeps its lane (the same sum).
 */
@inline function matmulK(six: bool, five: bool, y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32): void {
  const sb = <usize>(n >> 8) * (six ? Q6K_GROUP : five ? Q5K_GROUP : Q4K_GROUP);
  const qb = kRowBytes(n);
  const ys = <usize>d << 2;
  let g = g0;
  for (; g < g1 && ((g & 7) != 0 || g + 8 > g1); g++) oneRow(six, five, y, xq, w, rows, n, ys, qb, sb, r0, g);
  for (; g + 8 <= g1; g += 8) {
    const sp = w + <usize>(g >> 3) * sb;
    const yo = y + (<usize>(g - r0) << 2);
    let r = 0;
    for (; r + 4 <= rows; r += 4) {
      const yr = yo + <usize>r * ys;
      const xr = xq + <usize>r * qb;
      if (six) {
        q6Half4(yr, ys, xr, qb, sp, 0, n);
        q6Half4(yr + 16, ys, xr, qb, sp, 1, n);
      } else {
        q4Half4(five, yr, ys, xr, qb, sp, 0, n);
        q4Half4(five, yr + 16, ys, xr, qb, sp, 1, n);
      }
    }
    for (; r < rows; r++) {
      const yr = yo + <usize>r * ys;
      const xr = xq + <usize>r * qb;
      v128.store(yr, six ? q6Half1(xr, sp, 0, n) : q4Half1(five, xr, sp, 0, n));
      v128.store(yr, six ? q6Half1(xr, sp, 1, n) : q4Half1(five, xr, sp, 1, n), 16);
    }
  }
  for (; g < g1; g++) oneRow(six, five, y, xq, w, rows, n, ys, qb, sb, r0, g);
}

@inline function oneRow(six: bool, five: bool, y: usize, xq: usize, w: usize, rows: i32, n: i32, ys: usize, qb: usize, sb: usize, r0: i32, g: i32): void {
  const sp = w + <usize>(g >> 3) * sb;
  const half = <usize>((g >> 2) & 1);
  const lane = g & 3;
  for (let r = 0; r < rows; r++) {
    const xr = xq + <usize>r * qb;
    const v = six ? q6Half1(xr, sp, half, n) : q4Half1(five, xr, sp, half, n);
    const o = y + <usize>r * ys + (<usize>(g - r0) << 2);
    if (lane == 0) store<f32>(o, f32x4.extract_lane(v, 0));
    else if (lane == 1) store<f32>(o, f32x4.extract_lane(v, 1));
    else if (lane == 2) store<f32>(o, f32x4.extract_lane(v, 2));
    else store<f32>(o, f32x4.extract_lane(v, 3));
  }
}

/** q4_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` is unused. */
export function matmul_q4_k(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulK(false, false, y, xq, w, rows, n, d, r0, g0, g1);
}

/** q5_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` is unused. */
export function matmul_q5_k(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulK(false, true, y, xq, w, rows, n, d, r0, g0, g1);
}

/** q6_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` is unused. */
export function matmul_q6_k(y: usize, xq: usize, w: usize, rows: i32, n: i32, d: i32, r0: i32, g0: i32, g1: i32, scratch: usize): void {
  matmulK(true, false, y, xq, w, rows, n, d, r0, g0, g1);
}
