// A matrix's rows, as a file holds them (row-major: 16-bit weights, or ggml blocks), placed in
// the strip layouts the matmul kernels read: matmul.ts's (f16, bf16, and f16 in f16.ts' shifted
// coding, F16S), q8.ts's (q8_0, strip-
// layout.ts' q8Slot), kquants.ts's K STRIP LAYOUT and legacy.ts's LEGACY STRIP LAYOUT. strip-
// layout.ts' packU16 and packQ8, k-quant-strips.ts' packKStrip and legacy-strips.ts'
// packLegacyStrip state the same placements in plain JS, weight by weight; these write the same
// bytes (tests hold the two together on random rows) a strip at a time, so a load's rows can be
// cut into chunks of whole strips over every kernel thread (dispatch.ts' PLACE job; MatmulKernel
// reads the rows from the file into a stage and dispatches it).
//
// Every byte of every strip written is written, the rows of a last partial strip past `rows` as
// zeros: the destination may hold anything before.
//
// The quads. In both layouts a sub-block of 32 weights of row k (column ii) goes to 4 quads of
// 16 bytes, quad u holding row k's columns 8u .. 8u + 3 in the low nibbles of bytes 4k .. 4k + 3
// and 8u + 4 .. 8u + 7 in their high nibbles (e = (ii >> 2) * 16 + k * 4 + (ii & 3), byte e & 15
// of quad e >> 5, high when bit 4 of e is set). So the 32 nibbles of a row's sub-block, as bytes
// Q[0..31], make 16 bytes Q[8u + t] | Q[8u + 4 + t] << 4 (t = 0..3, u = 0..3), four of which go
// to each quad. The fifth bits: byte 4k + m of the sub-block's 16 holds, as bit t, the fifth bit
// of column 4t + m.

import { BF16, F16, F16S, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 } from "./dtype-index";
import { f16Shift } from "./f16";
import { Q4K_GROUP, Q5K_GROUP, Q6K_GROUP } from "./kquants";

const S: i32 = 8;

/** Whether dt's weights are 16-bit ones, placed each in two bytes (f16 in either coding, bf16). */
@inline function is16(dt: i32): bool {
  return dt == F16 || dt == F16S || dt == BF16;
}

/** Bytes of a q8_0 block: an f16 scale, then 32 int8. */
const Q8_BLOCK: usize = 34;

/** Bytes of one ggml block of dtype dt, 2 for a 16-bit weight (0 for a dtype not placed here). */
@inline function blockBytes(dt: i32): usize {
  if (is16(dt)) return 2;
  if (dt == Q8_0) return Q8_BLOCK;
  if (dt == Q4_K) return 144;
  if (dt == Q5_K) return 176;
  if (dt == Q6_K) return 210;
  if (dt == Q4_0) return 18;
  if (dt == Q4_1) return 20;
  if (dt == Q5_0) return 22;
  if (dt == Q5_1) return 24;
  return 0;
}

/** Weights a block of dt holds (1: a 16-bit weight). */
@inline function blockElems(dt: i32): i32 {
  if (is16(dt)) return 1;
  return dt == Q4_K || dt == Q5_K || dt == Q6_K ? 256 : 32;
}

/** Bytes of one group of a strip (one block of each of its 8 rows; 16 for 16-bit weights, 8 rows of one). */
@inline function groupBytes(dt: i32): usize {
  if (is16(dt)) return 16;
  if (dt == Q8_0) return Q8_BLOCK * S;
  if (dt == Q4_K) return Q4K_GROUP;
  if (dt == Q5_K) return Q5K_GROUP;
  if (dt == Q6_K) return Q6K_GROUP;
  return 144 + (dt == Q4_1 || dt == Q5_1 ? 16 : 0) + (dt == Q5_0 || dt == Q5_1 ? 32 : 0);
}

/** The 16 bytes of a row's sub-block nibbles (the quads above) from its nibbles as bytes q0 (columns 0..15) and q1 (16..31). */
@inline function quadBytes(q0: v128, q1: v128): v128 {
  const lo = i8x16.shuffle(q0, q1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const hi = i8x16.shuffle(q0, q1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // Every byte of hi is 0..15: shifting the 16-bit lanes by 4 moves no bit across a byte.
  return v128.or(lo, i16x8.shl(hi, 4));
}

/** The quads' 16 bytes v to row k's 4 bytes in each of the 4 quads from p. */
@inline function storeQuads(p: usize, k: i32, v: v128): void {
  const o = p + (<usize>(k & 3) << 2);
  v128.store32_lane(o, v, 0);
  v128.store32_lane(o, v, 1, 16);
  v128.store32_lane(o, v, 2, 32);
  v128.store32_lane(o, v, 3, 48);
}

/**
 * The fifth bits' 4 bytes of a row's sub-block: bit 7 of byte ii of b0 (columns 0..15) and b1
 * (16..31) is column ii's fifth bit; byte m of the result takes column 4t + m as bit t.
 */
@inline function fifthBytes(b0: v128, b1: v128): u32 {
  const m01 = i8x16.shuffle(b0, b1, 0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const m23 = i8x16.shuffle(b0, b1, 2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  return <u32>i8x16.bitmask(m01) | (<u32>i8x16.bitmask(m23) << 16);
}

/**
 * The 8 6-bit scales (lanes 0..7) and 8 mins (8..15) of the q4_k / q5_k block at b, as bytes,
 * from the 12 bytes of get_scale_min_k4's packing s at b + 4: for j < 4, scale s[j] & 63 and min
 * s[j + 4] & 63; for j >= 4, scale (s[j + 4] & 15) | (s[j - 4] >> 6) << 4 and min
 * (s[j + 4] >> 4) | (s[j] >> 6) << 4.
 */
@inline function scalesMins(b: usize): v128 {
  const s = v128.load(b, 4);
  // Lanes 0..3 s[0..3], 4..7 s[8..11], 8..11 s[4..7], 12..15 s[8..11]: each lane's low bits.
  const x = i8x16.shuffle(s, s, 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
  const low = v128.bitselect(v128.and(i16x8.shr_u(x, 4), i8x16.splat(15)), v128.and(x, i8x16(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)), i8x16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1));
  // Lanes 4..7 s[0..3], 12..15 s[4..7]: their top two bits, as bits 4..5.
  const y = i8x16.shuffle(s, i8x16.splat(0), 16, 16, 16, 16, 0, 1, 2, 3, 16, 16, 16, 16, 4, 5, 6, 7);
  return v128.or(low, v128.and(i16x8.shr_u(y, 2), i8x16.splat(0x30)));
}

/** Row k's q4_k or q5_k block at b into the group at g. */
@inline function placeK(five: bool, b: usize, k: i32, g: usize): void {
  const half = <usize>(k >> 2);
  const kk = <usize>(k & 3);
  store<u16>(g + (<usize>k << 1), load<u16>(b));
  store<u16>(g + 16 + (<usize>k << 1), load<u16>(b, 2));
  // Scales and mins alike in pairs of sub-blocks, four rows each: pair p of row k at 8 p + 2 k.
  const sm = scalesMins(b);
  const slot = g + half * 32 + (kk << 1);
  v128.store16_lane(slot + 32, sm, 0);
  v128.store16_lane(slot + 32, sm, 1, 8);
  v128.store16_lane(slot + 32, sm, 2, 16);
  v128.store16_lane(slot + 32, sm, 3, 24);
  v128.store16_lane(slot + 96, sm, 4);
  v128.store16_lane(slot + 96, sm, 5, 8);
  v128.store16_lane(slot + 96, sm, 6, 16);
  v128.store16_lane(slot + 96, sm, 7, 24);
  const nib = b + (five ? 48 : 16);
  const m15 = i8x16.splat(15);
  const h0 = five ? v128.load(b, 16) : i8x16.splat(0);
  const h1 = five ? v128.load(b, 32) : i8x16.splat(0);
  for (let p = 0; p < 4; p++) {
    const a0 = v128.load(nib + (<usize>p << 5));
    const a1 = v128.load(nib + (<usize>p << 5), 16);
    for (let s = 0; s < 2; s++) {
      const j = 2 * p + s;
      const q0 = s == 0 ? v128.and(a0, m15) : v128.and(i16x8.shr_u(a0, 4), m15);
      const q1 = s == 0 ? v128.and(a1, m15) : v128.and(i16x8.shr_u(a1, 4), m15);
      storeQuads(g + 160 + half * 512 + (<usize>j << 6), k, quadBytes(q0, q1));
      if (five) {
        // Bit j of each fifth-bit byte to bit 7 (16-bit shifts, cheaper than byte ones: what
        // moves across a byte lands below bit 7, which is all bitmask reads).
        const sh = 7 - j;
        store<u32>(g + Q4K_GROUP + half * 128 + (<usize>j << 4) + (kk << 2), fifthBytes(i16x8.shl(h0, sh), i16x8.shl(h1, sh)));
      }
    }
  }
}

/**
 * A row's sub-block of 16 q6_k values (q, bytes 0..63) as its unit's three planes want them, for
 * the 4 bytes of each: plane t's byte 4 row + m holds q[4t + m] in bits 0..5 (t = 0..2) and in
 * bits 6..7 a piece of q[12 + m]: its bits 4..5 in plane 0, 2..3 in plane 1, 0..1 in plane 2.
 * Lanes 4t .. 4t + 3 of the result are plane t's (lanes 12..15 are left over).
 */
@inline function q6Planes(q: v128): v128 {
  const top = i8x16.shuffle(q, q, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15);
  const hi = i8x16.splat(<i8>0xc0);
  const p0 = v128.and(i16x8.shl(top, 2), hi);
  const p1 = v128.and(i16x8.shl(top, 4), hi);
  const p2 = v128.and(i16x8.shl(top, 6), hi);
  const pieces = i8x16.shuffle(i8x16.shuffle(p0, p1, 0, 1, 2, 3, 20, 21, 22, 23, 0, 0, 0, 0, 0, 0, 0, 0), p2, 0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 0, 0, 0, 0);
  return v128.or(q, pieces);
}

/**
 * Row k's q6_k block at b into the group at g. ggml's sub-block s (16 weights: half h = s >> 3,
 * part p = (s >> 1) & 3, l from 16 (s & 1)) takes the low (p < 2) or high nibble of
 * ql[64 h + 32 (p & 1) + l] and bits 2p, 2p + 1 of qh[32 h + l] as bits 4..5.
 */
@inline function placeQ6(b: usize, k: i32, g: usize): void {
  const half = <usize>(k >> 2);
  const kk = <usize>(k & 3);
  store<u16>(g + (<usize>k << 1), load<u16>(b, 208));
  // The int8 scales in pairs of sub-blocks, four rows each: pair p of row k at 8 p + 2 k.
  const sc = v128.load(b, 192);
  const slot = g + 16 + half * 64 + (kk << 1);
  spread16(slot, sc);
  const m15 = i8x16.splat(15);
  const m3 = i8x16.splat(3);
  for (let h = 0; h < 2; h++) {
    const ql = b + (<usize>h << 6);
    const qh = b + 128 + (<usize>h << 5);
    for (let s2 = 0; s2 < 8; s2++) {
      const p = s2 >> 1;
      const l = <usize>(s2 & 1) << 4;
      const lowBits = v128.load(ql + <usize>((p & 1) << 5) + l);
      const nib = p < 2 ? v128.and(lowBits, m15) : v128.and(i16x8.shr_u(lowBits, 4), m15);
      const top = v128.and(i16x8.shr_u(v128.load(qh + l), <i32>(2 * p)), m3);
      const v = q6Planes(v128.or(nib, i16x8.shl(top, 4)));
      const s = (h << 3) + s2;
      const u = g + 144 + half * 768 + <usize>s * 48 + (kk << 2);
      v128.store32_lane(u, v, 0);
      v128.store32_lane(u, v, 1, 16);
      v128.store32_lane(u, v, 2, 32);
    }
  }
}

/** Row k's legacy block at b into the group at g. */
@inline function placeLegacy(min: bool, five: bool, b: usize, k: i32, g: usize): void {
  const half = <usize>(k >> 2);
  const kk = <usize>(k & 3);
  store<u16>(g + (<usize>k << 1), load<u16>(b));
  if (min) store<u16>(g + 16 + (<usize>k << 1), load<u16>(b, 2));
  const qs = b + 2 + (min ? 2 : 0) + (five ? 4 : 0);
  const a = v128.load(qs);
  const base: usize = 16 + (min ? 16 : 0);
  storeQuads(g + base + half * 64, k, quadBytes(v128.and(a, i8x16.splat(15)), v128.and(i16x8.shr_u(a, 4), i8x16.splat(15))));
  if (five) {
    // Column ii's fifth bit is bit ii of the little-endian u32 before qs: bit ii & 7 of byte ii >> 3.
    const qh = v128.load32_zero(b + 2 + (min ? 2 : 0));
    const spread0 = i8x16.shuffle(qh, qh, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const spread1 = i8x16.shuffle(qh, qh, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    // Byte ii keeps bit ii & 7 alone, made all ones when set: its bit 7 is the fifth bit.
    const bit = i8x16(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const zero = i8x16.splat(0);
    const b0 = i8x16.ne(v128.and(spread0, bit), zero);
    const b1 = i8x16.ne(v128.and(spread1, bit), zero);
    store<u32>(g + 144 + (min ? 16 : 0) + half * 16 + (kk << 2), fifthBytes(b0, b1));
  }
}

/** The 8 byte pairs of v (its i16 lanes) to o, o + 8, .., o + 56: a row's pairs among its four rows'. */
@inline function spread16(o: usize, v: v128): void {
  v128.store16_lane(o, v, 0);
  v128.store16_lane(o, v, 1, 8);
  v128.store16_lane(o, v, 2, 16);
  v128.store16_lane(o, v, 3, 24);
  v128.store16_lane(o, v, 4, 32);
  v128.store16_lane(o, v, 5, 40);
  v128.store16_lane(o, v, 6, 48);
  v128.store16_lane(o, v, 7, 56);
}

/**
 * Row k's q8_0 block at b into the group at g (strip-layout.ts' q8Slot): its scale among the 8,
 * then its int8 in pairs, pair p of row k at 16 + (k >> 2) * 128 + 8 p + 2 (k & 3).
 */
@inline function placeQ8(b: usize, k: i32, g: usize): void {
  store<u16>(g + (<usize>k << 1), load<u16>(b));
  const o = g + 16 + (<usize>(k >> 2) << 7) + (<usize>(k & 3) << 1);
  const a = v128.load(b, 2);
  const c = v128.load(b, 18);
  spread16(o, a);
  spread16(o + 64, c);
}

/**
 * Row k of 16-bit weights at r (n of them) into the strip at sp (matmul.ts' layout, packU16 in
 * strip-layout.ts): group c of 8 weights at sp + 128 c + 16 k in the order 0 4 1 5 2 6 3 7, then
 * the n % 8 past the groups after all groups, row after row; f16 weights in the shifted coding
 * when `shift` (each h as f16Shift makes it: first_bad has found every |w| < 128).
 */
@inline function place16Row(shift: bool, r: usize, n: i32, k: i32, sp: usize): void {
  const main = n & ~7;
  let o = sp + (<usize>k << 4);
  for (let c = 0; c < main; c += 8) {
    let v = v128.load(r + (<usize>c << 1));
    if (shift) v = shift8(v);
    v128.store(o, i8x16.shuffle(v, i8x16.splat(0), 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
    o += 128;
  }
  const tail = n - main;
  const t = sp + (<usize>main << 4) + (<usize>(k * tail) << 1);
  for (let j = 0; j < tail; j++) {
    const h = <u32>load<u16>(r + (<usize>(main + j) << 1));
    store<u16>(t + (<usize>j << 1), shift ? f16Shift(h) : h);
  }
}

/**
 * f16Shift of eight f16 patterns (each |w| < 128): a normal's exponent field plus 10 (0x2800,
 * which the sign bit never receives a carry from); a vector holding a zero or a subnormal (an
 * exponent field of 0: about 1 in 50 of a trained model's) takes shiftWithSubnormals. One test
 * for both kinds, not two. The shift is most of an f16 placement's arithmetic: a 1B-shape F16
 * file of trained-like weights places in 1.09 s against 0.96 plain (bench/load-quant.ts, AMD EPYC,
 * 5 alternating rounds), the price of its 1.16x decode.
 */
@inline function shift8(v: v128): v128 {
  const low = i16x8.eq(v128.and(v, i16x8.splat(0x7c00)), i16x8.splat(0));
  if (v128.any_true(low)) return shiftWithSubnormals(v, low);
  return i16x8.add(v, i16x8.splat(0x2800));
}

/**
 * shift8 for a vector with zeros or subnormals among its lanes (`low`, shift8's mask of them):
 * those normalized through f32 (normalized), the rest as shift8 does, every sign kept; the same
 * patterns as f16Shift's, lane for lane, without leaving the vector.
 */
function shiftWithSubnormals(v: v128, low: v128): v128 {
  const em = v128.and(v, i16x8.splat(0x7fff));
  const normal = i16x8.add(em, i16x8.splat(0x2800));
  const sub = i16x8.narrow_i32x4_u(normalized(i32x4.extend_low_i16x8_u(em)), normalized(i32x4.extend_high_i16x8_u(em)));
  return v128.or(v128.bitselect(sub, normal, low), v128.and(v, i16x8.splat(<i16>0x8000)));
}

/**
 * f16Shift's exponent-mantissa of subnormal or zero f16 patterns em (sign cleared, in i32 lanes):
 * m's f32 bits F, of exponent 127 + k and the bits below m's top bit, give (F >> 13) - (126 << 10)
 * = (k + 1) << 10 | the 10 bits after the top one; zero's give below 0, made 0.
 */
@inline function normalized(em: v128): v128 {
  const f = f32x4.convert_i32x4_u(em);
  return i32x4.max_s(i32x4.sub(i32x4.shr_u(f, 13), i32x4.splat(126 << 10)), i32x4.splat(0));
}

/**
 * Rows g0 .. g1 (g0 a multiple of 8) of the matrix at src (`rows` rows of n weights in ggml
 * blocks of dtype dt, row-major) into their strips at dst (strip s at s * the strip's bytes);
 * the last strip's rows past `rows` are zeros. A chunk of one PLACE job.
 */
export function place_rows(dst: usize, src: usize, dt: i32, n: i32, rows: i32, g0: i32, g1: i32): void {
  const bb = blockBytes(dt);
  const gb = groupBytes(dt);
  const blocks = n / blockElems(dt);
  const rowBytes = <usize>blocks * bb;
  const sb = <usize>blocks * gb;
  for (let s0 = g0; s0 < g1; s0 += S) {
    const sp = dst + <usize>(s0 / S) * sb;
    const k1 = min(S, rows - s0);
    if (k1 < S) memory.fill(sp, 0, sb);
    for (let k = 0; k < k1; k++) {
      const r = src + <usize>(s0 + k) * rowBytes;
      if (is16(dt)) {
        place16Row(dt == F16S, r, n, k, sp);
        continue;
      }
      for (let c = 0; c < blocks; c++) {
        const b = r + <usize>c * bb;
        const g = sp + <usize>c * gb;
        if (dt == Q8_0) placeQ8(b, k, g);
        else if (dt == Q4_K) placeK(false, b, k, g);
        else if (dt == Q5_K) placeK(true, b, k, g);
        else if (dt == Q6_K) placeQ6(b, k, g);
        else if (dt == Q4_0) placeLegacy(false, false, b, k, g);
        else if (dt == Q4_1) placeLegacy(true, false, b, k, g);
        else if (dt == Q5_0) placeLegacy(false, true, b, k, g);
        else if (dt == Q5_1) placeLegacy(true, true, b, k, g);
      }
    }
  }
}

/** 1 when place_rows places dtype dt (every dtype but f32), else 0. */
export function places(dt: i32): i32 {
  return blockBytes(dt) != 0 ? 1 : 0;
}

/**
 * The index of the first of `count` blocks of dt at src whose f16 scale (d, and dmin or m where
 * the block has one) is inf or NaN, for f16 the first of `count` weights that is (F16S: the first
 * that the shifted coding cannot hold, |w| >= 128, inf and NaN among them), else -1 (bf16: always
 * -1): the kernels read only finite f16.
 */
export function first_bad(src: usize, dt: i32, count: i32): i32 {
  if (dt == BF16) return -1;
  if (dt == F16 || dt == F16S) {
    // Plain: the exponent field all ones. Shifted: h & 0x7fff >= 0x5800, as i16 (sign cleared) > 0x57ff.
    const m: u32 = dt == F16 ? 0x7c00 : 0x7fff;
    const l: u32 = dt == F16 ? 0x7bff : 0x57ff;
    const mask = i16x8.splat(<i16>m);
    const lim = i16x8.splat(<i16>l);
    let i = 0;
    for (; i + 8 <= count; i += 8) {
      if (v128.any_true(i16x8.gt_s(v128.and(v128.load(src + (<usize>i << 1)), mask), lim))) break;
    }
    for (; i < count; i++) if ((<u32>load<u16>(src + (<usize>i << 1)) & m) > l) return i;
    return -1;
  }
  const bb = blockBytes(dt);
  const two = dt == Q4_K || dt == Q5_K || dt == Q4_1 || dt == Q5_1;
  // q6_k's d is its last two bytes.
  const d: usize = dt == Q6_K ? 208 : 0;
  for (let i = 0; i < count; i++) {
    const b = src + <usize>i * bb;
    if ((<u32>load<u16>(b + d) & 0x7c00) == 0x7c00) return i;
    if (two && (<u32>load<u16>(b, 2) & 0x7c00) == 0x7c00) return i;
  }
  return -1;
}
