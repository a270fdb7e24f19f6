// q4_k, q5_k and q6_k weights (ggml's K-quants, 256-weight super-blocks) against activations
// quantized per super-block to 8 bits, in integers (as ggml's vec_dot_q4_K_q8_K and
// vec_dot_q6_K_q8_K do).
//
// QUANTIZED X (quantize_k_x, once per dispatch per x): each token row, per 256-element
// super-block b: a = max |x_j|, s_b = a / 127, q_j = nearest-even(min(max(x_j * (s_b == 0 ? 0 :
// 1 / s_b), -127), 127)) (a NaN gives 0; every step in f32), so |q_j| <= 127 always. Row layout:
// the values as i8, each quad (j .. j + 3, j % 4 == 0) splatted over a v128 (16 bytes a quad: the
// kernels load it whole; a load32_splat measured slower under Bun), then the n / 256 scales s_b
// as f32, then the n / 16 sums of q over each 16 elements as i32, then per super-block its 8
// sums over each 32 elements as i16 (|sum| <= 32 * 127), one v128 for q4_k's and q5_k's mins,
// then per super-block its 16 sums over each 16 elements as i16 (|sum| <= 16 * 127), in pairs
// for q6_k's offset, then (16-aligned) the COMPACT X: the n values again as i8 in order.
//
// COMPACT X. A one-token kernel reads x's quads from the compact values, 4 bytes splatted by the
// load (xQuad): the same v128 as the splatted quad, so no bit changes, from a quarter of the
// bytes. A strip passes over all of x, and 4 n bytes of splatted quads outgrow the core's L1
// beside the streaming weights from n = 4096 on: one thread, q4_k, AMD EPYC, strip after strip
// over 1 GiB, 15.3 GB/s at n = 2048, 11.7 at 4096, 8.2 at 14336 splatted; compact 18.7, 16.5,
// 17.4 (q6_k at 14336: 11.5 -> 17.0), and 8B Q4_K_M decode 1.36x (bench/decode-ab.ts). The batch
// tiles keep the splatted quads: there each quad is loaded once per token, and the splat on the
// load cost more than the footprint saved (8B batch of 8, 0.91x).
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
//          (q the 6-bit weights 0..63, sc the int8 scales), which the kernel gathers as
//          sum_k sc_k * (sum_i q_i x_i) - 32 * sum_k sc_k * (sum_i x_i): the same integer.
// A and B are exact integers (q4_k |A| < 2^25, |B| < 2^21; q6_k |A| < 2^28: bounded by the ranges above),
// so the order inside a super-block does not matter; f32(A) rounds to nearest even like JS's
// Math.fround; every product and sum is rounded to f32 (WebAssembly never fuses them). The sum
// depends only on the weight row and its own token row: never on the tile, the batch or the
// thread. matmulQ4KRef and matmulQ6KRef (k-quant-ref.ts) state it in plain JS on ggml's blocks.
//
// THE RELAXED DOT, AND WHEN IT IS EXACT. The integer dots use relaxed SIMD's
// i16x8.relaxed_dot_i8x16_i7x16_s(x, q): lane l = x[2l] q[2l] + x[2l + 1] q[2l + 1]. Relaxed SIMD
// lets an engine treat q's bytes as signed or unsigned and saturate the pair sum (x86 lowers it
// to pmaddubsw, which saturates; arm64 to signed multiplies, which do not); all agree, and give
// the exact integer, WHEN EVERY q IS IN 0..127 AND EVERY x IN -128..127: then q reads the same
// either way, and |pair| <= 2 * 128 * 127 < 2^15 never saturates. Here q is an unsigned 4-, 5-
// or 6-bit weight (0..63 at most: the unpacking masks every byte) and x is QUANTIZED X's q
// (|x| <= 127), so the condition holds by construction. The pair sums then add up in i16 lanes
// only as far as they cannot overflow, and are widened to i32 (i32x4.dot_i16x8_s by ones) before
// they could: q4_k 8 pairs a lane (8 * 2 * 127 * 15 = 30480), q5_k 4 (4 * 2 * 127 * 31 = 31496),
// q6_k 2 (2 * 2 * 127 * 63 = 32004), each < 2^15 - 1. So every engine, whatever its lowering,
// gets the same integers, and the same bits (test/model/k-quant-kernels.test.ts feeds the
// extremes: weights at 0 and at their maximum, x at -127 and 127).
//
// THE K STRIP LAYOUT (k-quant-strips.ts packs it): rows in strips of 8, each strip a group per
// super-block, a group holding its 8 rows' super-blocks. Within a sub-block the 4 rows of a half
// strip (rows 0..3, 4..7) are interleaved in quads: element (row k, column i) is
// e = (i >> 2) * 16 + k * 4 + (i & 3), so 16 consecutive e are four columns of four rows, the
// four bytes the relaxed dot sums into each row's pair of lanes, against x's splatted quad.
//   q4_k group (1184 bytes): d of rows 0..7 (f16), dmin of rows 0..7 (f16), scales as u8 at
//     32 + half * 32 + (j >> 1) * 8 + k * 2 + (j & 1) and mins at 96 + half * 32 + the same (pairs
//     of sub-blocks: i32x4.dot_i16x8_s takes the mins against x's per-32 sums, and each scale,
//     shuffled into both its row's lanes, against the pair sums), then the nibbles at 160 + half * 512 +
//     j * 64: 4 quads of 16 bytes, byte b of quad u holding e = 32u + b low and e = 32u + 16 + b
//     high (columns 8u .. 8u + 3 low, 8u + 4 .. 8u + 7 high). (The 6-bit scales and mins are
//     unpacked to bytes: 4.625 bits a weight where ggml's block is 4.5.)
//   q6_k group (1680 bytes): d of rows 0..7 (f16), scales as i8 in pairs of sub-blocks at
//     16 + half * 64 + (k >> 1) * 8 + row * 2 + (k & 1) (a pair of rows' lanes widened to i16 is
//     both dot_i16x8_s's operand for the offset and, shuffled, each sub-block's scale), then per
//     half and sub-block a unit of 48 bytes at 144 + half * 768 + k * 48: planes b0, b1, b2 (16
//     bytes each). e = 16t + b for t = 0, 1, 2 is bits 0..5 of plane t's byte b; e = 48 + b is
//     spread over the top bits (6..7) of the three: bits 4..5 of its value in b0[b], 2..3 in
//     b1[b], 0..1 in b2[b]. (6.5625 bits a weight, as ggml's.) Three ands give the first three
//     quads; the fourth is gathered by adds and exact byte halvings (q6q3).
//   q5_k group (1440 bytes): q4_k's, then the fifth bits at 1184 + half * 128 + j * 16: bit t of
//     byte b is e = 16t + b, so quad u's low nibbles take bit 2u and its high ones bit 2u + 1,
//     each moved to bit 4 and or-ed in (the plane moving down 2 bits a quad): the kernel reads
//     5-bit values 0..31.

import { Q5_K, Q6_K } from "./dtype-index";
import { f16extScale } from "./f16";
import { Job } from "./job";

export const Q4K_GROUP: usize = 1184;
export const Q5K_GROUP: usize = 1440;
export const Q6K_GROUP: usize = 1680;

/**
 * Bytes of one token row of n quantized in i8 quads with a scale per 2^shift elements (QUANTIZED
 * X; shift 8 here, 5 for legacy.ts): the quads, the scales, the per-16 sums, and for shift 8 the
 * per-32 and per-16 sums as i16.
 */
@inline export function quadRowBytes(n: i32, shift: i32): usize {
  return compactOffset(n, shift) + ((<usize>n + 15) & ~15);
}

/** Where a quad row's compact values start (after the sums, 16-aligned). */
@inline function compactOffset(n: i32, shift: i32): usize {
  const i16Sums = shift == 8 ? (n >> 4) + (n >> 3) : 0;
  return (<usize>(4 * n + ((n >> shift) << 2) + (n >> 2) + i16Sums) + 15) & ~15;
}

/** Where a quad row's compact values (n i8, in order) start: the one-token kernels' x (see COMPACT X). */
@inline export function quadCompact(xq: usize, n: i32, shift: i32): usize {
  return xq + compactOffset(n, shift);
}

/**
 * x's quad at `off` bytes into the splatted quads from p: loaded whole (16 bytes), or, when cx,
 * from the compact values (p then points into them, off / 4 bytes on), its 4 bytes splatted on
 * the load: the same v128 either way.
 */
@inline export function xQuad(cx: bool, p: usize, off: usize): v128 {
  return cx ? v128.load32_splat(p + (off >> 2)) : v128.load(p + off);
}

/** off bytes of splatted quads as bytes of the compact values when cx. */
@inline export function xStep(cx: bool, off: usize): usize {
  return cx ? off >> 2 : off;
}

/** Where a quad row's scales start: after its n / 4 quads of 16 bytes. */
@inline export function quadScales(xq: usize, n: i32): usize {
  return xq + (<usize>n << 2);
}

/** Where a quad row's per-16 sums start: after its scales. */
@inline export function quadSums(xq: usize, n: i32, shift: i32): usize {
  return xq + (<usize>n << 2) + (<usize>(n >> shift) << 2);
}

@inline function kRowBytes(n: i32): usize {
  return quadRowBytes(n, 8);
}

export function k_row_bytes(n: i32): i32 {
  return <i32>kRowBytes(n);
}

@inline function scalesAt(xq: usize, n: i32): usize {
  return quadScales(xq, n);
}

/** Where a K row's per-32 sums (i16, a v128 a super-block) start: after its per-16 sums. */
@inline function sums32At(xq: usize, n: i32): usize {
  return quadSums(xq, n, 8) + (<usize>n >> 2);
}

/** Where a K row's per-16 sums as i16 (32 bytes a super-block) start: after its per-32 sums. */
@inline function sums16At(xq: usize, n: i32): usize {
  return sums32At(xq, n) + (<usize>n >> 4);
}

/** rows token rows of n f32 at x into the quantized layout at dst (see QUANTIZED X); n % 256 == 0. */
export function quantize_k_x(dst: usize, x: usize, rows: i32, n: i32): void {
  quantizeQuads(dst, x, rows, n, 8);
}

/**
 * rows token rows of n f32 at x into i8 quads at dst, a scale per block of 2^shift elements
 * (shift >= 4; see QUANTIZED X, whose rules every block follows); n a multiple of the block.
 */
@inline export function quantizeQuads(dst: usize, x: usize, rows: i32, n: i32, shift: i32): void {
  const qb = quadRowBytes(n, shift);
  const blocks = n >> shift;
  const bb: usize = <usize>4 << shift;
  const lim = f32x4.splat(127);
  const nlim = f32x4.splat(-127);
  for (let r = 0; r < rows; r++) {
    const xr = x + <usize>r * (<usize>n << 2);
    const qr = dst + <usize>r * qb;
    const sr = quadScales(qr, n);
    const ur = quadSums(qr, n, shift);
    const cr = quadCompact(qr, n, shift);
    for (let b = 0; b < blocks; b++) {
      const xp = xr + <usize>b * bb;
      let m = f32x4.abs(v128.load(xp));
      for (let i: usize = 16; i < bb; i += 16) m = f32x4.max(m, f32x4.abs(v128.load(xp + i)));
      const a = max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3)));
      const s: f32 = a / 127;
      const inv = f32x4.splat(s == 0 ? 0 : <f32>1 / s);
      store<f32>(sr + (<usize>b << 2), s);
      // 16 elements (64 bytes of x) per step: one sum each.
      for (let i: usize = 0; i < bb; i += 64) {
        const q0 = quant4(v128.load(xp + i), inv, lim, nlim);
        const q1 = quant4(v128.load(xp + i, 16), inv, lim, nlim);
        const q2 = quant4(v128.load(xp + i, 32), inv, lim, nlim);
        const q3 = quant4(v128.load(xp + i, 48), inv, lim, nlim);
        const t = i32x4.add(i32x4.add(q0, q1), i32x4.add(q2, q3));
        const sum = i32x4.extract_lane(t, 0) + i32x4.extract_lane(t, 1) + i32x4.extract_lane(t, 2) + i32x4.extract_lane(t, 3);
        store<i32>(ur + ((<usize>b * bb + i) >> 4), sum);
        // |q| <= 127: both narrowings are exact. Quad j of the 16 splatted at 16 j.
        const q = i8x16.narrow_i16x8_s(i16x8.narrow_i32x4_s(q0, q1), i16x8.narrow_i32x4_s(q2, q3));
        v128.store(cr + ((<usize>b * bb + i) >> 2), q);
        const o = qr + <usize>b * bb + i;
        v128.store(o, i32x4.shuffle(q, q, 0, 0, 0, 0));
        v128.store(o, i32x4.shuffle(q, q, 1, 1, 1, 1), 16);
        v128.store(o, i32x4.shuffle(q, q, 2, 2, 2, 2), 32);
        v128.store(o, i32x4.shuffle(q, q, 3, 3, 3, 3), 48);
      }
      if (shift == 8) {
        const u = ur + (<usize>b << 6);
        const o = quadSums(qr, n, 8) + (<usize>n >> 2) + (<usize>b << 4);
        for (let j: usize = 0; j < 8; j++) store<i16>(o + (j << 1), <i16>(load<i32>(u + (j << 3)) + load<i32>(u + (j << 3), 4)));
        const o16 = o + (<usize>(n >> 4) - (<usize>b << 4)) + (<usize>b << 5);
        for (let j: usize = 0; j < 16; j++) store<i16>(o16 + (j << 1), <i16>load<i32>(u + (j << 2)));
      }
    }
  }
}

/** Four f32 to i32 q: x * inv clamped to [-127, 127], nearest-even; NaN to 0. */
@inline function quant4(v: v128, inv: v128, lim: v128, nlim: v128): v128 {
  return i32x4.trunc_sat_f32x4_s(f32x4.nearest(f32x4.min(f32x4.max(f32x4.mul(v, inv), nlim), lim)));
}

/** Four f16 at p made f32x4. */
@inline function f16at(p: usize): v128 {
  return f16extScale(i32x4.extend_low_i16x8_s(v128.load64_zero(p)));
}

// ---------------------------------------------------------------------------------------- dots

/**
 * s + the pair sums of x (16 i8, |x| <= 127) by q (16 bytes, each in 0..127): the relaxed dot
 * under the condition that makes it exact (THE RELAXED DOT); the caller bounds how many it adds.
 */
@inline export function rdot(s: v128, x: v128, q: v128): v128 {
  return i16x8.add(s, i16x8.relaxed_dot_i8x16_i7x16_s(x, q));
}

/** Adjacent i16 lanes summed into i32 (a row's two pair sums into its lane), exactly. */
@inline export function widen(s: v128): v128 {
  return i32x4.dot_i16x8_s(s, i16x8.splat(1));
}

/** s + the dots of one nibble quad's low (lo) and high (hi) values against a token's two splatted x quads at x. */
@inline export function dot2(s: v128, x: usize, lo: v128, hi: v128, cx: bool = false): v128 {
  return rdot(rdot(s, xQuad(cx, x, 0), lo), xQuad(cx, x, 16), hi);
}

/** dot2 from zero (Binaryen keeps an add of a zero vector, so the first pair is not added to one). */
@inline export function dot2z(x: usize, lo: v128, hi: v128, cx: bool = false): v128 {
  return rdot(i16x8.relaxed_dot_i8x16_i7x16_s(xQuad(cx, x, 0), lo), xQuad(cx, x, 16), hi);
}

// ---------------------------------------------------------------------------------------- q4_k

// Moving bits within bytes. Bun 1.4.4's JavaScriptCore lowers a vector shift by a constant to
// four x86 instructions (the count moved, masked and sent to a vector register each time) and a
// rounding multiply to as many, but a 16-bit multiply and a byte average to one each (seen in
// the Air that BUN_JSC_dumpOMGDisassembly=1 prints). So a bit goes left by a multiply after its
// mask, right by exact halvings (avgr_u against 0 of an even byte), and a whole nibble by one
// shift and a mask (measured: q4_k batch 1, one thread, 19.4 -> 24.5 GMAC/s against the and,
// rounding multiply, and before).

/** Each byte of v (even) halved exactly: (v + 0 + 1) >> 1 rounds nothing away. */
@inline export function halve(v: v128): v128 {
  return i8x16.avgr_u(v, i8x16.splat(0));
}

/** Bit b (a constant) of each byte of h moved to bit 4 (a value of 16). */
@inline export function bitTo4(h: v128, b: i32): v128 {
  const bit = <i32>1 << b;
  const m = v128.and(h, i8x16.splat(<i8>bit));
  const up = <i32>16 >> b;
  if (b < 4) return i16x8.mul(m, i16x8.splat(<i16>up));
  if (b == 5) return halve(m);
  if (b == 6) return halve(halve(m));
  if (b == 7) return halve(halve(halve(m)));
  return m;
}

/** Bits 0 (lo) and 1 (hi) of each byte of h moved to bit 4. */
@inline export function bit0to4(h: v128): v128 {
  return bitTo4(h, 0);
}

@inline export function bit1to4(h: v128): v128 {
  return bitTo4(h, 1);
}

/** Each byte of h shifted right by 2 (its bits 2..7 to 0..5). */
@inline export function next2(h: v128): v128 {
  return halve(halve(v128.and(h, i8x16.splat(<i8>0xfc))));
}

/** The high nibble of each byte of v as a value 0..15. */
@inline export function highNibble(v: v128): v128 {
  return v128.and(i16x8.shr_u(v, 4), i8x16.splat(0x0f));
}

/** A nibble quad's low values: 0..15, or with q5_k's fifth bit (bit 0 of h) 0..31. */
@inline export function lowOf(five: bool, v: v128, h: v128): v128 {
  const lo = v128.and(v, i8x16.splat(0x0f));
  return five ? v128.or(lo, bit0to4(h)) : lo;
}

/** A nibble quad's high values: 0..15, or with q5_k's fifth bit (bit 1 of h) 0..31. */
@inline export function highOf(five: bool, v: v128, h: v128): v128 {
  return five ? v128.or(highNibble(v), bit1to4(h)) : highNibble(v);
}

/** lowOf and highOf for quad u (a constant) of a sub-block, reading its fifth bits (2u, 2u + 1) from the sub-block's whole plane hb: no next2 between quads. */
@inline export function lowAt(five: bool, v: v128, hb: v128, u: i32): v128 {
  const lo = v128.and(v, i8x16.splat(0x0f));
  return five ? v128.or(lo, bitTo4(hb, 2 * u)) : lo;
}

@inline export function highAt(five: bool, v: v128, hb: v128, u: i32): v128 {
  return five ? v128.or(highNibble(v), bitTo4(hb, 2 * u + 1)) : highNibble(v);
}

/**
 * One sub-block's sc * (sum q_i x_i) of a half strip (4 rows in lanes) against one token: w its 64
 * nibble bytes, hb q5_k's fifth-bit plane of it, xj the token's 8 splatted x quads, scv each
 * row's scale in both its i16 lanes (ones for the plain sum). Two i16 sums of 4 pairs a lane each
 * (q4_k adds them before widening: 8 pairs; q5_k widens each), widened and scaled at once by
 * i32x4.dot_i16x8_s: exact while |sum| * |sc| * 2 < 2^31 (sc <= 63 here, 1 for legacy.ts).
 */
@inline export function q4Sub(five: bool, w: usize, hb: v128, xj: usize, scv: v128, cx: bool = false): v128 {
  let v = v128.load(w);
  let s = dot2z(xj, lowAt(five, v, hb, 0), highAt(five, v, hb, 0), cx);
  v = v128.load(w, 16);
  s = dot2(s, xj + xStep(cx, 32), lowAt(five, v, hb, 1), highAt(five, v, hb, 1), cx);
  v = v128.load(w, 32);
  let t = dot2z(xj + xStep(cx, 64), lowAt(five, v, hb, 2), highAt(five, v, hb, 2), cx);
  v = v128.load(w, 48);
  t = dot2(t, xj + xStep(cx, 96), lowAt(five, v, hb, 3), highAt(five, v, hb, 3), cx);
  return five ? i32x4.add(i32x4.dot_i16x8_s(s, scv), i32x4.dot_i16x8_s(t, scv)) : i32x4.dot_i16x8_s(i16x8.add(s, t), scv);
}

/** Sub-block j's scales for 4 rows, each row's in both its i16 lanes, from a pair vector p (i16: row 0 j, row 0 j + 1, row 1 j, ...; j even). */
@inline export function pairEven(p: v128): v128 {
  return i8x16.shuffle(p, p, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
}

/** pairEven's for sub-block j + 1. */
@inline export function pairOdd(p: v128): v128 {
  return i8x16.shuffle(p, p, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
}

/** Sub-block j's scales for a half strip's 4 rows (the scale bytes at sc), each row's in both its i16 lanes. */
@inline function subScales(sc: usize, j: usize): v128 {
  const pr = v128.load8x8_u(sc + ((j >> 1) << 3));
  return (j & 1) == 0 ? pairEven(pr) : pairOdd(pr);
}

/** A half strip's q4_k (q5_k when five) super-block sum term for one token: f32(A) * (d * s) - f32(B) * (dmin * s), B from the per-32 sums at sums. */
@inline function q4Term(five: bool, g: usize, half: usize, xb: usize, s: f32, sums: usize, cx: bool = false): v128 {
  let a = i32x4.splat(0);
  const wq = g + 160 + half * 512;
  const sc = g + 32 + half * 32;
  const mn = g + 96 + half * 32;
  const bits = g + Q4K_GROUP + half * 128;
  const z = i32x4.splat(0);
  for (let j: usize = 0; j < 8; j += 2) {
    const p = v128.load8x8_u(sc + (j << 2));
    a = i32x4.add(a, q4Sub(five, wq + j * 64, five ? v128.load(bits + j * 16) : z, xb + xStep(cx, j << 7), pairEven(p), cx));
    a = i32x4.add(a, q4Sub(five, wq + j * 64 + 64, five ? v128.load(bits + j * 16 + 16) : z, xb + xStep(cx, (j << 7) + 128), pairOdd(p), cx));
  }
  const sv = f32x4.splat(s);
  const dv = f32x4.mul(f16at(g + (half << 3)), sv);
  const mv = f32x4.mul(f16at(g + 16 + (half << 3)), sv);
  return f32x4.sub(f32x4.mul(f32x4.convert_i32x4_s(a), dv), f32x4.mul(f32x4.convert_i32x4_s(minSum(mn, sums)), mv));
}

/**
 * B = sum_j m_j * (sum of x over sub-block j) for 4 rows (lanes): the mins at mn in pairs of
 * sub-blocks, against the token's per-32 sums at xs (i16x8), a pair splatted per dot. Every
 * product and sum is exact in i32 (|B| < 2^21), so this is the integer B of THE K ORDER.
 */
@inline function minSum(mn: usize, xs: usize): v128 {
  const s = v128.load(xs);
  const b0 = i32x4.dot_i16x8_s(v128.load8x8_u(mn), i32x4.shuffle(s, s, 0, 0, 0, 0));
  const b1 = i32x4.dot_i16x8_s(v128.load8x8_u(mn, 8), i32x4.shuffle(s, s, 1, 1, 1, 1));
  const b2 = i32x4.dot_i16x8_s(v128.load8x8_u(mn, 16), i32x4.shuffle(s, s, 2, 2, 2, 2));
  const b3 = i32x4.dot_i16x8_s(v128.load8x8_u(mn, 24), i32x4.shuffle(s, s, 3, 3, 3, 3));
  return i32x4.add(i32x4.add(b0, b1), i32x4.add(b2, b3));
}

/** A half strip (rows 4 * half ..) of q4_k (q5_k when five) at sp against one quantized token row xq. */
@inline function q4Half1(five: bool, xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 8;
  let acc = f32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sums32At(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * (five ? Q5K_GROUP : Q4K_GROUP);
    acc = f32x4.add(acc, q4Term(five, g, half, xq + (<usize>c << 10), load<f32>(sr + (<usize>c << 2)), ur + (<usize>c << 4)));
  }
  return acc;
}

/**
 * Super-block c (group g) of a half strip of q5_k, its values unpacked at un (q5UnpackBlock),
 * against four token rows from xq (qb apart): each token's term added to its running sums at
 * yo + t * ys (q4Term's integers, in q4Half1's order). The block's A per token stays in registers.
 */
@inline function q5Block4(un: usize, yo: usize, ys: usize, xq: usize, qb: usize, g: usize, half: usize, c: i32, n: i32): void {
  const z = i32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sums32At(xq, n);
  const sc = g + 32 + half * 32;
  const mn = g + 96 + half * 32;
  const xb = xq + (<usize>c << 10);
  let a0 = z, a1 = z, a2 = z, a3 = z;
  for (let j: usize = 0; j < 8; j++) {
    const xj = xb + (j << 7);
    let s0 = z, s1 = z, s2 = z, s3 = z;
    // Two passes of two quads, widened after each: 4 pairs a lane (THE RELAXED DOT).
    for (let p: usize = 0; p < 64; p += 32) {
      for (let u = p; u < p + 32; u += 16) {
        const q = un + (j << 7) + (u << 1);
        const lo = v128.load(q);
        const hi = v128.load(q, 16);
        const x = xj + (u << 1);
        s0 = dot2(s0, x, lo, hi);
        s1 = dot2(s1, x + qb, lo, hi);
        s2 = dot2(s2, x + 2 * qb, lo, hi);
        s3 = dot2(s3, x + 3 * qb, lo, hi);
      }
      // Loaded here, not before the passes: one more live vector there spills on x86.
      const scv = subScales(sc, j);
      a0 = i32x4.add(a0, i32x4.dot_i16x8_s(s0, scv));
      a1 = i32x4.add(a1, i32x4.dot_i16x8_s(s1, scv));
      a2 = i32x4.add(a2, i32x4.dot_i16x8_s(s2, scv));
      a3 = i32x4.add(a3, i32x4.dot_i16x8_s(s3, scv));
      s0 = z; s1 = z; s2 = z; s3 = z;
    }
  }
  q4Finish4(yo, ys, a0, a1, a2, a3, g, half, mn, sr + (<usize>c << 2), ur + (<usize>c << 4), qb);
}

/**
 * A strip of q4_k (q5_k when five) against `count` (8 or 4) token rows from xq (qb apart), outputs
 * of token t at yo + t * ys (both halves): per super-block, its half 0 for every token, then its
 * half 1 (q4BlockN), so the tokens' x of the block (1 KB each) comes from L1 the second time; half
 * by half over the whole strip read it from L2 twice (AMD EPYC, alternating builds, 8 token rows:
 * one thread 0.94-0.98x the time, two threads past L3 0.86-1.03x).
 *
 * With k > 1 (4, matmulK's groups of 32 rows), k strips ss bytes apart in step: super-block c of
 * each in turn, so the tokens' x of the block (8 KB for 8 tokens) is read from L2 once for the k
 * strips, not once per strip; each strip's sums keep their order (the same bits), its outputs 32
 * bytes on from the last's.
 */
@inline function q4StripN(five: bool, acc: usize, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, n: i32, count: usize, k: i32 = 1, ss: usize = 0, so: usize = 32): void {
  const blocks = n >> 8;
  const z = i32x4.splat(0);
  for (let s = 0; s < k; s++) {
    for (let t: usize = 0; t < count; t++) {
      v128.store(yo + <usize>s * so + t * ys, z);
      v128.store(yo + <usize>s * so + t * ys, z, 16);
    }
  }
  for (let c = 0; c < blocks; c++) {
    for (let s = 0; s < k; s++) {
      const g = sp + <usize>s * ss + <usize>c * (five ? Q5K_GROUP : Q4K_GROUP);
      const ysb = yo + <usize>s * so;
      q4BlockN(five, acc, ysb, ys, xq, qb, g, 0, c, n, count);
      q4BlockN(five, acc, ysb + 16, ys, xq, qb, g, 1, c, n, count);
    }
  }
}

/**
 * Super-block c (group g) of a half strip of q4_k (q5_k when five) against `count` token rows:
 * each token's term added to its running sums at yo + t * ys (q4Term's integers, in q4Half1's
 * order). The sub-block's four quads are unpacked once into eight registers and each token in
 * turn runs its eight dots against them from one pointer at constant offsets; quad by quad for all
 * the tokens (a running sum each, each token's x address from its row) spent a quarter of its
 * instructions on addresses and spilled ones. One thread, alternating builds, AMD EPYC: 8 token
 * rows q4_k 52-57 -> 61-63 GMAC/s (1.07-1.14x on two threads), q5_k 1.18-1.31x; 4 rows
 * 1.08-1.15x both. The integer sums of the block live at acc (128 bytes of scratch).
 */
@inline function q4BlockN(five: bool, acc: usize, yo: usize, ys: usize, xq: usize, qb: usize, g: usize, half: usize, c: i32, n: i32, count: usize): void {
  const z = i32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sums32At(xq, n);
  const wq = g + 160 + half * 512;
  const sc = g + 32 + half * 32;
  const mn = g + 96 + half * 32;
  const bits = g + Q4K_GROUP + half * 128;
  const xb = xq + (<usize>c << 10);
  for (let t: usize = 0; t < count; t++) v128.store(acc + (t << 4), z);
  for (let j: usize = 0; j < 8; j++) {
    const w = wq + j * 64;
    const hb = five ? v128.load(bits + j * 16) : z;
    const v0 = v128.load(w);
    const v1 = v128.load(w, 16);
    const v2 = v128.load(w, 32);
    const v3 = v128.load(w, 48);
    const l0 = lowAt(five, v0, hb, 0);
    const h0 = highAt(five, v0, hb, 0);
    const l1 = lowAt(five, v1, hb, 1);
    const h1 = highAt(five, v1, hb, 1);
    const l2 = lowAt(five, v2, hb, 2);
    const h2 = highAt(five, v2, hb, 2);
    const l3 = lowAt(five, v3, hb, 3);
    const h3 = highAt(five, v3, hb, 3);
    const scv = subScales(sc, j);
    let x = xb + (j << 7);
    for (let t: usize = 0; t < count; t++) {
      // q4_k adds all 8 pairs a lane before widening; q5_k widens after 4 (THE RELAXED DOT).
      let q = rdot(i16x8.relaxed_dot_i8x16_i7x16_s(v128.load(x), l0), v128.load(x, 16), h0);
      q = rdot(rdot(q, v128.load(x, 32), l1), v128.load(x, 48), h1);
      if (five) {
        addDot(acc + (t << 4), q, scv);
        q = rdot(i16x8.relaxed_dot_i8x16_i7x16_s(v128.load(x, 64), l2), v128.load(x, 80), h2);
      } else q = rdot(rdot(q, v128.load(x, 64), l2), v128.load(x, 80), h2);
      q = rdot(rdot(q, v128.load(x, 96), l3), v128.load(x, 112), h3);
      addDot(acc + (t << 4), q, scv);
      x += qb;
    }
  }
  const dq = f16at(g + (half << 3));
  const dm = f16at(g + 16 + (half << 3));
  for (let t: usize = 0; t < count; t++) {
    q4Finish(yo + t * ys, v128.load(acc + (t << 4)), dq, dm, mn, sr + t * qb + (<usize>c << 2), ur + t * qb + (<usize>c << 4));
  }
}

/** The i32 sums at p plus s's pair sums scaled by scv (q5Block4's a += dot_i16x8_s(s, scv)). */
@inline function addDot(p: usize, s: v128, scv: v128): void {
  v128.store(p, i32x4.add(v128.load(p), i32x4.dot_i16x8_s(s, scv)));
}

/**
 * Group g's half of q5_k values unpacked to bytes at un: per sub-block j and quad u (0, 16, 32,
 * 48), its low values at un + j * 128 + 2 u and its high ones 16 bytes on.
 */
@inline function q5UnpackBlock(g: usize, half: usize, un: usize): void {
  const wq = g + 160 + half * 512;
  const bits = g + Q4K_GROUP + half * 128;
  for (let j: usize = 0; j < 8; j++) {
    let h = v128.load(bits + j * 16);
    for (let u: usize = 0; u < 64; u += 16) {
      const v = v128.load(wq + j * 64 + u);
      const q = un + (j << 7) + (u << 1);
      v128.store(q, lowOf(true, v, h));
      v128.store(q, highOf(true, v, h), 16);
      h = next2(h);
    }
  }
}

/**
 * q4Finish for four tokens' sums a0 .. a3 of super-block group g's half: token t's outputs at
 * yo + t * ys, its scale at sp + t * qb and its per-32 sums at sums + t * qb.
 */
@inline function q4Finish4(yo: usize, ys: usize, a0: v128, a1: v128, a2: v128, a3: v128, g: usize, half: usize, mn: usize, sp: usize, sums: usize, qb: usize): void {
  const dq = f16at(g + (half << 3));
  const dm = f16at(g + 16 + (half << 3));
  q4Finish(yo, a0, dq, dm, mn, sp, sums);
  q4Finish(yo + ys, a1, dq, dm, mn, sp + qb, sums + qb);
  q4Finish(yo + 2 * ys, a2, dq, dm, mn, sp + 2 * qb, sums + 2 * qb);
  q4Finish(yo + 3 * ys, a3, dq, dm, mn, sp + 3 * qb, sums + 3 * qb);
}

/** y at yo += f32(a) * (d * s) - f32(B) * (dmin * s) for one token (B from its per-32 sums), as q4Term. */
@inline function q4Finish(yo: usize, a: v128, dq: v128, dm: v128, mn: usize, sp: usize, sums: usize): void {
  const sv = f32x4.splat(load<f32>(sp));
  const t = f32x4.sub(f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(dq, sv)), f32x4.mul(f32x4.convert_i32x4_s(minSum(mn, sums)), f32x4.mul(dm, sv)));
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

// ---------------------------------------------------------------------------------------- q6_k

/**
 * Quad 3 of a unit (b0, b1, b2 its three 16-byte planes; see THE K STRIP LAYOUT): its 2-bit
 * pieces sit in the top bits (a value of 64 each), low piece in b2, high in b0, so Horner's rule
 * with exact quarterings gathers them: ((64 p0 / 4 + 64 p1) / 4 + 64 p2) / 4 = p0 + 4 p1 + 16 p2.
 * Every partial sum stays below 256 (at most 252) and even where it is halved.
 */
@inline function q6q3(b0: v128, b1: v128, b2: v128): v128 {
  const top = i8x16.splat(<i8>0xc0);
  const v = halve(halve(i8x16.add(halve(halve(v128.and(b2, top))), v128.and(b1, top))));
  return halve(halve(i8x16.add(v, v128.and(b0, top))));
}

/** Quad 0, 1 or 2 of a unit: the low six bits of its plane. */
@inline function q6low(b: v128): v128 {
  return v128.and(b, i8x16.splat(0x3f));
}

/**
 * a + sc * (sum q_i x_i) over one sub-block (its quads t0..t3) for one token (its 4 splatted x quads
 * at xk): two i16 sums of 2 pairs a lane (each < 2^15: THE RELAXED DOT), each widened and scaled
 * at once by i32x4.dot_i16x8_s against the row's scale in both its lanes (|sc| <= 128: exact).
 */
@inline function q6Acc(a: v128, t0: v128, t1: v128, t2: v128, t3: v128, xk: usize, scv: v128, cx: bool = false): v128 {
  const s = dot2z(xk, t0, t1, cx);
  const t = dot2z(xk + xStep(cx, 32), t2, t3, cx);
  return i32x4.add(a, i32x4.add(i32x4.dot_i16x8_s(s, scv), i32x4.dot_i16x8_s(t, scv)));
}

/**
 * 32 * sum_k sc_k * (sum of x over sub-block k) for 4 rows: the scales in pairs of sub-blocks at
 * sc against the token's per-16 sums as i16 at xs (|sum| <= 16 * 127), a pair splatted per dot.
 * Exact in i32 (|result| < 2^27), so A = (the scaled dots) - this is THE K ORDER's integer.
 */
@inline function q6Offset(sc: usize, xs: usize): v128 {
  let c = i32x4.splat(0);
  for (let j: usize = 0; j < 8; j++) c = i32x4.add(c, i32x4.dot_i16x8_s(v128.load8x8_s(sc + (j << 3)), v128.load32_splat(xs + (j << 2))));
  return i32x4.mul(c, i32x4.splat(32));
}

/** A half strip's q6_k super-block sum term for one token: f32(A) * (d * s). */
@inline function q6Term(g: usize, half: usize, xb: usize, s: f32, sums: usize, cx: bool = false): v128 {
  let a = i32x4.splat(0);
  const units = g + 144 + half * 768;
  const sc = g + 16 + half * 64;
  for (let j: usize = 0; j < 8; j++) {
    const p = v128.load8x8_s(sc + (j << 3));
    const u = units + j * 96;
    const xk = xb + xStep(cx, j << 7);
    let b0 = v128.load(u), b1 = v128.load(u, 16), b2 = v128.load(u, 32);
    a = q6Acc(a, q6low(b0), q6low(b1), q6low(b2), q6q3(b0, b1, b2), xk, pairEven(p), cx);
    b0 = v128.load(u, 48);
    b1 = v128.load(u, 64);
    b2 = v128.load(u, 80);
    a = q6Acc(a, q6low(b0), q6low(b1), q6low(b2), q6q3(b0, b1, b2), xk + xStep(cx, 64), pairOdd(p), cx);
  }
  a = i32x4.sub(a, q6Offset(sc, sums));
  return f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(f16at(g + (half << 3)), f32x4.splat(s)));
}

@inline function q6Half1(xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 8;
  let acc = f32x4.splat(0);
  const sr = scalesAt(xq, n);
  const ur = sums16At(xq, n);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * Q6K_GROUP;
    acc = f32x4.add(acc, q6Term(g, half, xq + (<usize>c << 10), load<f32>(sr + (<usize>c << 2)), ur + (<usize>c << 5)));
  }
  return acc;
}

/**
 * A whole strip against one token row, front to back: per super-block its half 0 term, then its
 * half 1 term (q4Term, q6Term), the two halves' running sums in registers, stored at yo at the
 * end: each half's additions are q4Half1's (q6Half1's), in their order. Half by half, each pass
 * skipped the other half's bytes of every group. A one-token chunk takes four strips in step
 * (kStrips with k = 4, dispatch.ts' THE STREAMS); this takes a batch's odd rows and a piece that
 * a job's ends cut.
 */
@inline function kStrip(six: bool, five: bool, yo: usize, xq: usize, sp: usize, n: i32): void {
  kStrips(six, five, 1, yo, 0, xq, sp, 0, n);
}

/** Half `half` of the super-block group at g against the token's block at xb (scale s, sums u). */
@inline function kTerm(six: bool, five: bool, g: usize, half: usize, xb: usize, s: f32, u: usize): v128 {
  return six ? q6Term(g, half, xb, s, u, true) : q4Term(five, g, half, xb, s, u, true);
}

/**
 * k (1 or 4, a constant) whole strips far apart (at sp, sp + ss, ...) against one token row, in
 * step, a super-block of each in turn (dispatch.ts' THE STREAMS): each strip's sums kStrip's, in
 * its order, so the same bits; outputs of strip t at yo + t * ys2. q5_k's go to q5Strips.
 *
 * The four strips' half 0 terms come first, then their half 1 terms, so each stream is read in
 * two bursts with three other half terms between them, and the lines the prefetcher fetched for
 * a half arrive while the other strips compute. Half 0 then half 1 of each strip in turn left the
 * second half waiting on its lines: in the profile of 8B Q4_K_M decode (Intel Xeon) q6_k's half 1
 * loads waited twice as long as its half 0's, and q6_k (26 lines a group) read 18.0 GB/s where
 * q4_k (18.5 lines) read 21.5. In this order q6_k reads 20.6-20.9 and q4_k 21.8; decode 1.074x
 * at 8B and 1.104x at 1B (bench/decode-ab.ts, 3 rounds, decode-ab.s18-k-halves-in-turn-*.json).
 * Quarter terms in turn (each half's integer in two passes) ran q6_k 21.0 but q4_k 20.5 GB/s.
 */
@inline function kStrips(six: bool, five: bool, k: i32, yo: usize, ys2: usize, xq: usize, sp: usize, ss: usize, n: i32): void {
  if (five) {
    q5Strips(k, yo, ys2, xq, sp, ss, n);
    return;
  }
  const blocks = n >> 8;
  const grp: usize = six ? Q6K_GROUP : Q4K_GROUP;
  let a0 = f32x4.splat(0);
  let a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  const sr = scalesAt(xq, n);
  const ur = six ? sums16At(xq, n) : sums32At(xq, n);
  const xc = quadCompact(xq, n, 8);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * grp;
    const s = load<f32>(sr + (<usize>c << 2));
    const xb = xc + (<usize>c << 8);
    const u = ur + (<usize>c << (six ? 5 : 4));
    a0 = f32x4.add(a0, kTerm(six, five, g, 0, xb, s, u));
    if (k > 1) {
      b0 = f32x4.add(b0, kTerm(six, five, g + ss, 0, xb, s, u));
      c0 = f32x4.add(c0, kTerm(six, five, g + 2 * ss, 0, xb, s, u));
      d0 = f32x4.add(d0, kTerm(six, five, g + 3 * ss, 0, xb, s, u));
    }
    a1 = f32x4.add(a1, kTerm(six, five, g, 1, xb, s, u));
    if (k > 1) {
      b1 = f32x4.add(b1, kTerm(six, five, g + ss, 1, xb, s, u));
      c1 = f32x4.add(c1, kTerm(six, five, g + 2 * ss, 1, xb, s, u));
      d1 = f32x4.add(d1, kTerm(six, five, g + 3 * ss, 1, xb, s, u));
    }
  }
  storeStrips(k, yo, ys2, a0, a1, b0, b1, c0, c1, d0, d1);
}

/**
 * kStrips for q5_k: the same terms in the same order, each strip's running sums kept at its
 * outputs (yo + t * ys2) between terms rather than in registers (a store and a load of an f32
 * change no bit). q5_k's term holds its fifth-bit plane and masks beside q4_k's values, and with
 * the eight sums in registers besides, JavaScriptCore's code for the four strips moved vectors to
 * and from the stack 1454 times for its 128 dots (q4_k's 56; now 47 for 16 dots, the loops no
 * longer unrolled). One thread, 4096-column rows, Intel Xeon (bench/kernel-bounds.ts WALK=streams
 * N=4096 HUGE=1): from L2 7.6 -> 13.2 GB/s, from DRAM 5.6 -> 7.1; 1B Q5_K_M decode 75.6 -> 63.8
 * ms a token (1.185x, bench/decode-ab.ts, three alternating rounds).
 */
@inline function q5Strips(k: i32, yo: usize, ys2: usize, xq: usize, sp: usize, ss: usize, n: i32): void {
  const blocks = n >> 8;
  zeroRuns(yo, ys2, 0, 1, <usize>k);
  const sr = scalesAt(xq, n);
  const ur = sums32At(xq, n);
  const xc = quadCompact(xq, n, 8);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * Q5K_GROUP;
    const s = load<f32>(sr + (<usize>c << 2));
    const xb = xc + (<usize>c << 8);
    const u = ur + (<usize>c << 4);
    for (let half: usize = 0; half < 2; half++) {
      for (let t = 0; t < k; t++) {
        const y = yo + <usize>t * ys2 + (half << 4);
        v128.store(y, f32x4.add(v128.load(y), q4Term(true, g + <usize>t * ss, half, xb, s, u, true)));
      }
    }
  }
}

/** The running sums of k (1 or 4) strips' two halves (a0 a1 for strip 0, ...) at yo + t * ys2. */
@inline export function storeStrips(k: i32, yo: usize, ys2: usize, a0: v128, a1: v128, b0: v128, b1: v128, c0: v128, c1: v128, d0: v128, d1: v128): void {
  v128.store(yo, a0);
  v128.store(yo, a1, 16);
  if (k == 1) return;
  v128.store(yo + ys2, b0);
  v128.store(yo + ys2, b1, 16);
  v128.store(yo + 2 * ys2, c0);
  v128.store(yo + 2 * ys2, c1, 16);
  v128.store(yo + 3 * ys2, d0);
  v128.store(yo + 3 * ys2, d1, 16);
}

/**
 * Super-block c of a half strip of q6_k against four token rows from xq (qb apart; `count`, a
 * constant, 1 to 3 for a small batch's): each token's term added to its running sums at yo + t * ys
 * (as q6Term's, in q6Half1's order). Each unit is
 * unpacked once for the four tokens, from the group (pre false) or read unpacked from un (pre:
 * q6UnpackBlock's 1 KB). With nx, the same half of the group at ng (the next super-block) is
 * unpacked to nx a unit per unit of the pass (kBlocks' steady stream).
 */
@inline function q6Block4(pre: bool, un: usize, yo: usize, ys: usize, xq: usize, qb: usize, g: usize, half: usize, c: i32, n: i32, nx: usize = 0, ng: usize = 0, count: i32 = 4): void {
  const sr = scalesAt(xq, n);
  const ur = sums16At(xq, n);
  const units = g + 144 + half * 768;
  const sc = g + 16 + half * 64;
  const xb = xq + (<usize>c << 10);
  let a0 = i32x4.splat(0), a1 = a0, a2 = a0, a3 = a0;
  // Two sub-blocks a pass: their scales come from one pair vector.
  for (let k: usize = 0; k < 16; k += 2) {
    const p = v128.load8x8_s(sc + (k << 2));
    for (let e: usize = 0; e < 2; e++) {
      let t0: v128, t1: v128, t2: v128, t3: v128;
      if (pre) {
        const q = un + ((k + e) << 6);
        t0 = v128.load(q);
        t1 = v128.load(q, 16);
        t2 = v128.load(q, 32);
        t3 = v128.load(q, 48);
      } else {
        const u = units + (k + e) * 48;
        const b0 = v128.load(u);
        const b1 = v128.load(u, 16);
        const b2 = v128.load(u, 32);
        t3 = q6q3(b0, b1, b2);
        t0 = q6low(b0);
        t1 = q6low(b1);
        t2 = q6low(b2);
      }
      if (nx != 0) q6UnpackUnit(ng + 144 + half * 768 + (k + e) * 48, nx + ((k + e) << 6));
      const scv = e == 0 ? pairEven(p) : pairOdd(p);
      const xk = xb + ((k + e) << 6);
      a0 = q6Acc(a0, t0, t1, t2, t3, xk, scv);
      if (count > 1) a1 = q6Acc(a1, t0, t1, t2, t3, xk + qb, scv);
      if (count > 2) a2 = q6Acc(a2, t0, t1, t2, t3, xk + 2 * qb, scv);
      if (count > 3) a3 = q6Acc(a3, t0, t1, t2, t3, xk + 3 * qb, scv);
    }
  }
  // q6Offset for the four tokens at once: each pair vector of scales loaded once.
  const us = ur + (<usize>c << 5);
  let c0 = i32x4.splat(0), c1 = c0, c2 = c0, c3 = c0;
  for (let j: usize = 0; j < 8; j++) {
    const p = v128.load8x8_s(sc + (j << 3));
    const o = us + (j << 2);
    c0 = i32x4.add(c0, i32x4.dot_i16x8_s(p, v128.load32_splat(o)));
    if (count > 1) c1 = i32x4.add(c1, i32x4.dot_i16x8_s(p, v128.load32_splat(o + qb)));
    if (count > 2) c2 = i32x4.add(c2, i32x4.dot_i16x8_s(p, v128.load32_splat(o + 2 * qb)));
    if (count > 3) c3 = i32x4.add(c3, i32x4.dot_i16x8_s(p, v128.load32_splat(o + 3 * qb)));
  }
  const k32 = i32x4.splat(32);
  const dq = f16at(g + (half << 3));
  q6Finish(yo, i32x4.sub(a0, i32x4.mul(c0, k32)), dq, sr + (<usize>c << 2));
  if (count > 1) q6Finish(yo + ys, i32x4.sub(a1, i32x4.mul(c1, k32)), dq, sr + qb + (<usize>c << 2));
  if (count > 2) q6Finish(yo + 2 * ys, i32x4.sub(a2, i32x4.mul(c2, k32)), dq, sr + 2 * qb + (<usize>c << 2));
  if (count > 3) q6Finish(yo + 3 * ys, i32x4.sub(a3, i32x4.mul(c3, k32)), dq, sr + 3 * qb + (<usize>c << 2));
}

/** A half strip of q6_k against four token rows, outputs of token t at yo + t * ys: q6Block4 over the super-blocks, each unit unpacked for the four. */
@inline function q6Half4(yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < 4; t++) v128.store(yo + t * ys, z);
  for (let c = 0; c < (n >> 8); c++) q6Block4(false, 0, yo, ys, xq, qb, sp + <usize>c * Q6K_GROUP, half, c, n);
}

/**
 * A strip of q6_k (q5_k when not six) against `count` token rows (a multiple of 4) from xq,
 * outputs of token t at yo + t * ys (both halves): per super-block, its values unpacked once into
 * un (2 KB: 1 KB a half), then four tokens at a time from there (q6Block4, q5Block4), both halves
 * of each four in turn (their x stays in L1). Unpacking the whole strip first for all the tokens
 * made that pass a bare stream of weight loads, with nothing to do while they came (perf, q6_k, 8
 * token rows: 35% of the time in the unpack, most of it on its loads); one super-block at a time,
 * its loads meet the tokens' dots of the block before.
 *
 * q6_k goes one step further: super-block c + 1 is unpacked (into the other 2 KB of un) a unit at
 * a time inside the first four tokens' pass over super-block c (q6Block4's nx), so its 26 lines
 * are asked for one 48-byte unit per unit of dots, a steady stream the core's prefetcher keeps
 * ahead of, where a super-block unpacked whole asked for them at once and waited for them all
 * (perf from DRAM: 2,000 of 16,000 samples on the unpack's loads, 50 with the weights in L2). One
 * thread, 8 token rows (bench/kernel-bounds.ts, kernel-bounds.s19-xeon-*.json): from L2 44.6 ->
 * 46.3 GMAC/s, from DRAM 33.3 -> 37.8; the 8B shapes on 2 threads 66 -> 78 GMAC/s.
 */
@inline function kBlocks(six: bool, un: usize, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, n: i32, count: usize): void {
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < count; t++) {
    v128.store(yo + t * ys, z);
    v128.store(yo + t * ys, z, 16);
  }
  const blocks = n >> 8;
  if (six) {
    q6UnpackBlock(sp, 0, un);
    q6UnpackBlock(sp, 1, un + 1024);
  }
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * (six ? Q6K_GROUP : Q5K_GROUP);
    // q6_k: this super-block's values were unpacked during the last one's first four tokens.
    const cu = six ? un + ((<usize>c & 1) << 11) : un;
    const nx = six && c + 1 < blocks ? un + ((<usize>(c + 1) & 1) << 11) : 0;
    if (!six) {
      q5UnpackBlock(g, 0, un);
      q5UnpackBlock(g, 1, un + 1024);
    }
    for (let t: usize = 0; t < count; t += 4) {
      const yt = yo + t * ys;
      const xt = xq + t * qb;
      if (six) {
        const first = t == 0 && nx != 0;
        q6Block4(true, cu, yt, ys, xt, qb, g, 0, c, n, first ? nx : 0, g + Q6K_GROUP);
        q6Block4(true, cu + 1024, yt + 16, ys, xt, qb, g, 1, c, n, first ? nx + 1024 : 0, g + Q6K_GROUP);
      } else {
        q5Block4(un, yt, ys, xt, qb, g, 0, c, n);
        q5Block4(un + 1024, yt + 16, ys, xt, qb, g, 1, c, n);
      }
    }
  }
}

/** Group g's half of 6-bit values unpacked to bytes at un: unit k's quads t at un + k * 64 + 16 t. */
@inline function q6UnpackBlock(g: usize, half: usize, un: usize): void {
  const units = g + 144 + half * 768;
  for (let k: usize = 0; k < 16; k++) q6UnpackUnit(units + k * 48, un + (k << 6));
}

/** The unit at u (48 bytes) unpacked to its four quads at q. */
@inline function q6UnpackUnit(u: usize, q: usize): void {
  const b0 = v128.load(u);
  const b1 = v128.load(u, 16);
  const b2 = v128.load(u, 32);
  v128.store(q, q6low(b0));
  v128.store(q, q6low(b1), 16);
  v128.store(q, q6low(b2), 32);
  v128.store(q, q6q3(b0, b1, b2), 48);
}

@inline function q6Finish(yo: usize, a: v128, dq: v128, sp: usize): void {
  const t = f32x4.mul(f32x4.convert_i32x4_s(a), f32x4.mul(dq, f32x4.splat(load<f32>(sp))));
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

// ------------------------------------------------------------------------------------ dispatch

/**
 * Rows g0 .. g1 of the matrix at w (q4_k, q5_k when five, q6_k when six; a thread's share)
 * against every quantized token row at xq; row g's outputs go to column g - r0 of y. One token
 * row takes each strip whole (kStrip); more take it a super-block at a time, four tokens at a
 * time (kBlocks: q6_k from 8 rows, q5_k from 12), or by tiles of eight tokens then four (q4StripN:
 * q4_k, and q5_k below 12 rows; q6Half4: q6_k below 8), the last few one token at a time; a row
 * of a strip not wholly in the range computes its half alone and keeps its lane (the same sum).
 */
@inline function matmulK(six: bool, five: bool, job: usize, g0: i32, g1: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const y = j.y;
  const xq = j.x;
  const w = j.w;
  const rows = j.rows;
  const n = j.n;
  const d = j.d;
  const r0 = j.r0;
  const sb = <usize>(n >> 8) * (six ? Q6K_GROUP : five ? Q5K_GROUP : Q4K_GROUP);
  const qb = kRowBytes(n);
  const ys = <usize>d << 2;
  let g = g0;
  for (; g < g1 && ((g & 7) != 0 || g + 8 > g1); g++) oneRow(six, five, y, xq, w, rows, n, ys, qb, sb, r0, g);
  // q4_k against 8 token rows or more: four strips in step (q4StripN with k = 4), their x read
  // once a super-block for the four. One strip at a time, the 8B Q4_K_M forward of 8 decode rows
  // ran at 750 or 790 ms depending only on where the activation buffers and the quantized x fell
  // mod 128 KiB (the engine's layout after a prefill was the slow one: every weight load of the
  // q4_k tile waited longer, by its profile); in step it runs 724-735 ms in both (Intel Xeon, 2
  // threads; the w1/w3 dispatch 355.8 -> 328.6 ms a step; README, session 19).
  if (!six && !five && rows >= 8) {
    for (; g + 32 <= g1; g += 32) {
      const yo = y + (<usize>(g - r0) << 2);
      const sp = w + <usize>(g >> 3) * sb;
      let r = 0;
      for (; r + 8 <= rows; r += 8) q4StripN(false, scratch, yo + <usize>r * ys, ys, xq + <usize>r * qb, qb, sp, n, 8, 4, sb);
      for (let s: usize = 0; s < 4; s++) stripTail(false, false, scratch, yo + (s << 5), ys, xq, qb, sp + s * sb, n, r, rows);
    }
  }
  for (; g + 8 <= g1; g += 8) {
    const sp = w + <usize>(g >> 3) * sb;
    const yo = y + (<usize>(g - r0) << 2);
    let r = 0;
    // Unpacked a super-block at a time for all the token rows (kBlocks): q6_k from 8 token rows,
    // q5_k from 12 (at 8 the stores and loads cost more than they save: 1.05-1.09x the time of
    // q4StripN; at 12 0.82-0.90x, at 14 0.91-0.94x; one thread, the three shapes of 2048 and
    // 8192, alternating builds). q4_k never:
    // q4StripN from its nibbles beat unpacking at every count (AMD EPYC, one thread, alternating
    // builds: 1.13-1.32x at 16 rows, 1.01-1.13x at 64, 0.99-1.10x at 512).
    if (six && rows >= 8) {
      r = rows & ~3;
      kBlocks(true, scratch, yo, ys, xq, qb, sp, n, <usize>r);
    }
    if (five && rows >= 12) {
      r = rows & ~3;
      kBlocks(false, scratch, yo, ys, xq, qb, sp, n, <usize>r);
    }
    // Eight tokens at a time where the strip is not unpacked (q4_k, and q5_k below 12 rows), then four.
    if (!six) {
      for (; r + 8 <= rows; r += 8) q4StripN(five, scratch, yo + <usize>r * ys, ys, xq + <usize>r * qb, qb, sp, n, 8);
    }
    stripTail(six, five, scratch, yo, ys, xq, qb, sp, n, r, rows);
  }
  for (; g < g1; g++) oneRow(six, five, y, xq, w, rows, n, ys, qb, sb, r0, g);
}

/** Token rows r .. rows of the strip at sp, four at a time, then one at a time (the tiles' tail). */
@inline function stripTail(six: bool, five: bool, scratch: usize, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, n: i32, r0: i32, rows: i32): void {
  let r = r0;
  for (; r + 4 <= rows; r += 4) {
    const yr = yo + <usize>r * ys;
    const xr = xq + <usize>r * qb;
    if (six) {
      q6Half4(yr, ys, xr, qb, sp, 0, n);
      q6Half4(yr + 16, ys, xr, qb, sp, 1, n);
    } else q4StripN(five, scratch, yr, ys, xr, qb, sp, n, 4);
  }
  for (; r < rows; r++) kStrip(six, five, yo + <usize>r * ys, xq + <usize>r * qb, sp, n);
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

/** q4_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` holds 2 KB at least (the unpacked super-block; q4_k takes 128 bytes of it). */
export function matmul_q4_k(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulK(false, false, job, g0, g1, scratch);
}

/** q5_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` holds 2 KB at least (the unpacked super-block; q4_k takes 128 bytes of it). */
export function matmul_q5_k(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulK(false, true, job, g0, g1, scratch);
}

/** q6_k matmul (see matmulK); n must be a multiple of 256 (the caller checks); `scratch` holds 2 KB at least (the unpacked super-block; q4_k takes 128 bytes of it). */
export function matmul_q6_k(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulK(true, false, job, g0, g1, scratch);
}

/** Four strips in step (kStrips) over whole strips g0 .. g1 and the three pieces far rows after them (all in the job). */
@inline function kStreams(six: bool, five: bool, job: usize, g0: i32, g1: i32, far: i32): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const sb = <usize>(n >> 8) * (six ? Q6K_GROUP : five ? Q5K_GROUP : Q4K_GROUP);
  for (let g = g0; g < g1; g += 8) kStrips(six, five, 4, j.y + (<usize>(g - j.r0) << 2), <usize>far << 2, j.x, j.w + <usize>(g >> 3) * sb, <usize>(far >> 3) * sb, n);
}

/**
 * One token row in four streams far rows apart (kStreams), fn the K kernel's index; or 2 to 7
 * token rows of q4_k (kStreamsQ4Rows), q5_k (kStreamsQ5Rows) or q6_k (kStreamsQ6Rows).
 */
export function matmul_k_streams(fn: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  if (changetype<Job>(job).rows > 1) {
    if (fn == Q6_K) kStreamsQ6Rows(job, g0, g1, far);
    else if (fn == Q5_K) kStreamsQ5Rows(job, g0, g1, far, scratch);
    else kStreamsQ4Rows(job, g0, g1, far, scratch);
  } else if (fn == Q6_K) kStreamsQ6(job, g0, g1, far);
  else if (fn == Q5_K) kStreamsQ5(job, g0, g1, far);
  else kStreamsQ4(job, g0, g1, far);
}

/**
 * q4_k against 2 to 7 token rows, a small decode batch, as THE STREAMS walk one token (dispatch.ts):
 * strips g0 .. g1 and the three runs far rows after them in step, super-block c of each in turn
 * (q4StripN with k = 4, its outputs far columns apart), every token against each sub-block
 * unpacked once. Each row's sum keeps its order: the same bits. Strip after strip, one thread read
 * a 4-token q4_k matrix from DRAM at 32 GMAC/s against 52 from L2 (Intel Xeon,
 * bench/kernel-bounds.ts ROWS=4). In the streams, two threads, bench/decode-ab.ts, three
 * alternating rounds: a step of 4 sequences 1B Q4_K_M 90.6 -> 83.9 ms (1.080x), 8B 487.3 -> 461.6
 * ms (1.056x); of 2 (all of them walked so since) 77.0 -> 62.1 ms (1.24x), of 3 98.4 -> 79.2.
 */
function kStreamsQ4Rows(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  const rows = changetype<Job>(job).rows;
  if (rows == 2) q4Rows2(job, g0, g1, far, scratch);
  else if (rows == 3) q4Rows3(job, g0, g1, far, scratch);
  else if (rows == 4) q4Rows4(job, g0, g1, far, scratch);
  else if (rows == 5) q4Rows5(job, g0, g1, far, scratch);
  else if (rows == 6) q4Rows6(job, g0, g1, far, scratch);
  else q4Rows7(job, g0, g1, far, scratch);
}

// Each row count a function of its own, its count a constant: with the count read from the job,
// a step of 4 sequences of 1B Q4_K_M ran 0.95x (bench/decode-ab.ts, Intel Xeon).
function q4Rows2(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 2);
}
function q4Rows3(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 3);
}
function q4Rows4(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 4);
}
function q4Rows5(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 5);
}
function q4Rows6(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 6);
}
function q4Rows7(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(false, job, g0, g1, far, scratch, 7);
}

/** kStreamsQ4Rows for q5_k (its tile of four tokens is q4StripN's too), the count read from the job. */
function kStreamsQ5Rows(job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  kStreamsRows(true, job, g0, g1, far, scratch, changetype<Job>(job).rows);
}

@inline function kStreamsRows(five: bool, job: usize, g0: i32, g1: i32, far: i32, scratch: usize, rows: i32): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const ys = <usize>j.d << 2;
  const qb = kRowBytes(n);
  const sb = <usize>(n >> 8) * (five ? Q5K_GROUP : Q4K_GROUP);
  const ss = <usize>(far >> 3) * sb;
  const so = <usize>far << 2;
  for (let g = g0; g < g1; g += 8) {
    const yo = j.y + (<usize>(g - j.r0) << 2);
    const sp = j.w + <usize>(g >> 3) * sb;
    q4StripN(five, scratch, yo, ys, j.x, qb, sp, n, <usize>rows, 4, ss, so);
  }
}

/** The running sums of `count` tokens (ys apart) in `runs` runs so bytes apart (8 rows of outputs each) set to 0. */
@inline export function zeroRuns(yo: usize, so: usize, ys: usize, count: usize = 4, runs: usize = 4): void {
  const z = f32x4.splat(0);
  for (let s: usize = 0; s < runs; s++) {
    for (let t: usize = 0; t < count; t++) {
      v128.store(yo + s * so + t * ys, z);
      v128.store(yo + s * so + t * ys, z, 16);
    }
  }
}

/**
 * q6_k against 2 to 7 token rows in THE STREAMS, as kStreamsQ4Rows: super-block c of the four runs
 * in turn, both halves, for the first four tokens (or all two or three: q6Block4 reading the groups,
 * as q6Half4), then the other one to three while the block is in L1. Each row's sum keeps its
 * order: the same bits. Strip after strip, one thread read a 4-token q6_k matrix from DRAM at 22
 * GMAC/s against 38 from L2 (Intel Xeon, bench/kernel-bounds.ts ROWS=4). In the streams (two
 * threads, bench/decode-ab.ts, three alternating rounds, over kStreamsQ4Rows alone): a step of 4
 * sequences 1B Q4_K_M 84.5 -> 80.0 ms (1.056x), 8B 464.0 -> 441.6 ms (1.051x).
 */
function kStreamsQ6Rows(job: usize, g0: i32, g1: i32, far: i32): void {
  const rows = changetype<Job>(job).rows;
  if (rows == 2) q6Rows2(job, g0, g1, far);
  else if (rows == 3) q6Rows3(job, g0, g1, far);
  else if (rows == 4) q6Rows4(job, g0, g1, far);
  else if (rows == 5) q6Rows5(job, g0, g1, far);
  else if (rows == 6) q6Rows6(job, g0, g1, far);
  else q6Rows7(job, g0, g1, far);
}

// Each row count a function of its own: JavaScriptCore allocates registers a function at a time
// (q8.ts' runs2 .. runs7, all in one function, ran a step of 2 sequences 1.17x slower).
function q6Rows2(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 2, 0);
}
function q6Rows3(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 3, 0);
}
function q6Rows4(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 4, 0);
}
function q6Rows5(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 4, 1);
}
function q6Rows6(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 4, 2);
}
function q6Rows7(job: usize, g0: i32, g1: i32, far: i32): void {
  q6Runs(job, g0, g1, far, 4, 3);
}

/**
 * kStreamsQ6Rows with its first `count` tokens, then `rest` more, per super-block of each run
 * (constants: q6Block4 keeps a sum for each token in registers).
 */
@inline function q6Runs(job: usize, g0: i32, g1: i32, far: i32, count: i32, rest: i32): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const ys = <usize>j.d << 2;
  const qb = kRowBytes(n);
  const sb = <usize>(n >> 8) * Q6K_GROUP;
  const ss = <usize>(far >> 3) * sb;
  const so = <usize>far << 2;
  for (let g = g0; g < g1; g += 8) {
    const yo = j.y + (<usize>(g - j.r0) << 2);
    const sp = j.w + <usize>(g >> 3) * sb;
    zeroRuns(yo, so, ys, <usize>(count + rest));
    for (let c = 0; c < (n >> 8); c++) {
      for (let s: usize = 0; s < 4; s++) {
        const gs = sp + s * ss + <usize>c * Q6K_GROUP;
        const yt = yo + s * so;
        q6Block4(false, 0, yt, ys, j.x, qb, gs, 0, c, n, 0, 0, count);
        q6Block4(false, 0, yt + 16, ys, j.x, qb, gs, 1, c, n, 0, 0, count);
        if (rest > 0) {
          q6Block4(false, 0, yt + 4 * ys, ys, j.x + 4 * qb, qb, gs, 0, c, n, 0, 0, rest);
          q6Block4(false, 0, yt + 4 * ys + 16, ys, j.x + 4 * qb, qb, gs, 1, c, n, 0, 0, rest);
        }
      }
    }
  }
}

// kStreams of each type as a function of its own: JavaScriptCore allocates registers a function
// at a time, and the three inlined into one (43 KB of WebAssembly) leave each less room.
function kStreamsQ4(job: usize, g0: i32, g1: i32, far: i32): void {
  kStreams(false, false, job, g0, g1, far);
}

function kStreamsQ5(job: usize, g0: i32, g1: i32, far: i32): void {
  kStreams(false, true, job, g0, g1, far);
}

function kStreamsQ6(job: usize, g0: i32, g1: i32, far: i32): void {
  kStreams(true, false, job, g0, g1, far);
}
