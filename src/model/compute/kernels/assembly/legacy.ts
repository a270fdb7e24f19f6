// q4_0, q4_1, q5_0 and q5_1 weights (ggml's 32-weight blocks) against x quantized per 32-block
// to 8 bits in kquants.ts's quads (QUANTIZED X there, with a scale per 32 elements: |q_j| <= 127,
// a scale s_b per block, the sums of q per 16, X_b the block's two), in integers.
//
// THE LEGACY ORDER. Per output, one running f32 sum from 0 over the 32-blocks in order:
//   q4_0, q5_0:  acc = acc + f32(I) * (d * s_b)
//   q4_1, q5_1:  acc = acc + (f32(I) * (d * s_b) + f32(X_b) * (m * s_b))
// with I = sum_j u_j q_j + offset * X_b, u_j the unsigned weights (the nibble, with q5's fifth
// bit as 16), offset -8 (q4_0), -16 (q5_0) or 0 (the _1 types), d and m the block's f16 values
// made f32. I and X_b are exact integers (|I| < 2^17), each product and sum rounded to f32. Per
// output row only, as THE Q8 ORDER: matmulLegacyRef in matmul.ts states it in plain JS on ggml's
// blocks.
//
// The dot sum_j u_j q_j is kquants.ts's q4_k (q5_k) sub-block dot, relaxed dot and all: u is
// unsigned 4- or 5-bit, so THE RELAXED DOT's condition holds here as there.
//
// THE LEGACY STRIP LAYOUT (legacy-strips.ts packs it): a strip of 8 rows is a group per 32-block:
// the 8 rows' d (f16, 16 bytes), the _1 types' 8 m (16 bytes), then the nibbles of each half
// strip (64 bytes each: 4 quads of 16 bytes, byte b of quad u holding e = 32u + b low and
// e = 32u + 16 + b high, e = (i >> 2) * 16 + k * 4 + (i & 3) for column i of row k, as
// kquants.ts's quads of columns of four rows), then for the q5 types each half's fifth bits
// (16 bytes: bit t of byte b is e = 16t + b, as q5_k's). 144, 160, 176 and 192 bytes a group:
// 4.5, 5, 5.5 and 6 bits a weight, ggml's own.

import { Q4_0, Q4_1, Q5_0 } from "./dtype-index";
import { f16extScale } from "./f16";
import { Job } from "./job";
import { dot2, highAt, highOf, lowAt, lowOf, next2, q4Sub, quadCompact, quadRowBytes, quadScales, quadSums, quantizeQuads, rdot, storeStrips, widen, zeroRuns } from "./kquants";

/** Bytes of one quantized token row of n (a multiple of 32). */
@inline function qRowBytes(n: i32): usize {
  return quadRowBytes(n, 5);
}

/** qRowBytes, for MatmulKernel to size the space. */
export function l_row_bytes(n: i32): i32 {
  return <i32>qRowBytes(n);
}

/** rows token rows of n f32 at x into the legacy kernels' quantized layout at dst; n % 32 == 0. */
export function quantize_l_x(dst: usize, x: usize, rows: i32, n: i32): void {
  quantizeQuads(dst, x, rows, n, 5);
}

@inline function groupBytes(min: bool, five: bool): usize {
  return 144 + (min ? 16 : 0) + (five ? 32 : 0);
}

/** Four f16 at p made f32x4. */
@inline function f16at(p: usize): v128 {
  return f16extScale(i32x4.extend_low_i16x8_s(v128.load64_zero(p)));
}

/** X_b of block c: its two per-16 sums. */
@inline function blockSum(ur: usize, c: i32): i32 {
  return load<i32>(ur + (<usize>c << 3)) + load<i32>(ur + (<usize>c << 3), 4);
}

/** A half strip (rows 4 * half ..) of the matrix at sp against one quantized token row xq. */
@inline function half1(min: bool, five: bool, offset: i32, xq: usize, sp: usize, half: usize, n: i32): v128 {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + half * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + half * 16;
  const sr = quadScales(xq, n);
  const ur = quadSums(xq, n, 5);
  let acc = f32x4.splat(0);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * gb;
    const i = q4Sub(five, g + nib0, five ? v128.load(g + bits0) : i32x4.splat(0), xq + (<usize>c << 7), i16x8.splat(1));
    acc = f32x4.add(acc, term(min, offset, i, f16at(g + (half << 3)), min ? f16at(g + 16 + (half << 3)) : i32x4.splat(0), sr + (<usize>c << 2), blockSum(ur, c)));
  }
  return acc;
}

/** Half h of the group at g: block c's term for one token row, its compact values at xc (half1's, one block). */
@inline function halfTerm(min: bool, five: bool, offset: i32, g: usize, h: usize, xc: usize, c: i32, sr: usize, ur: usize): v128 {
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + h * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + h * 16;
  const i = q4Sub(five, g + nib0, five ? v128.load(g + bits0) : i32x4.splat(0), xc + (<usize>c << 5), i16x8.splat(1), true);
  return term(min, offset, i, f16at(g + (h << 3)), min ? f16at(g + 16 + (h << 3)) : i32x4.splat(0), sr + (<usize>c << 2), blockSum(ur, c));
}

/**
 * The whole strip at sp against one token row, block by block: its half 0 term, then its half 1
 * term, each half's running sum in half1's order (the outputs at yo, yo + 4, ...); half strip by
 * half strip, each pass skipped the other half's bytes. A one-token chunk takes four strips in
 * step (strips with k = 4, dispatch.ts' THE STREAMS); this takes a batch's odd rows and a piece
 * that a job's ends cut.
 */
@inline function strip1(min: bool, five: bool, offset: i32, yo: usize, xq: usize, sp: usize, n: i32): void {
  strips(min, five, offset, 1, yo, 0, xq, sp, 0, n);
}

/**
 * k (1 or 4, a constant) strips ss bytes apart (sp, sp + ss, ...) against one token row, in step,
 * block by block: each strip's sums strip1's, in its order, held in registers; outputs of strip t
 * at yo + t * ys2.
 */
@inline function strips(min: bool, five: bool, offset: i32, k: i32, yo: usize, ys2: usize, xq: usize, sp: usize, ss: usize, n: i32): void {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const sr = quadScales(xq, n);
  const ur = quadSums(xq, n, 5);
  const xc = quadCompact(xq, n, 5);
  let a0 = f32x4.splat(0);
  let a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * gb;
    a0 = f32x4.add(a0, halfTerm(min, five, offset, g, 0, xc, c, sr, ur));
    a1 = f32x4.add(a1, halfTerm(min, five, offset, g, 1, xc, c, sr, ur));
    if (k > 1) {
      b0 = f32x4.add(b0, halfTerm(min, five, offset, g + ss, 0, xc, c, sr, ur));
      b1 = f32x4.add(b1, halfTerm(min, five, offset, g + ss, 1, xc, c, sr, ur));
      c0 = f32x4.add(c0, halfTerm(min, five, offset, g + 2 * ss, 0, xc, c, sr, ur));
      c1 = f32x4.add(c1, halfTerm(min, five, offset, g + 2 * ss, 1, xc, c, sr, ur));
      d0 = f32x4.add(d0, halfTerm(min, five, offset, g + 3 * ss, 0, xc, c, sr, ur));
      d1 = f32x4.add(d1, halfTerm(min, five, offset, g + 3 * ss, 1, xc, c, sr, ur));
    }
  }
  storeStrips(k, yo, ys2, a0, a1, b0, b1, c0, c1, d0, d1);
}

/** Four strips in step (strips) over whole strips g0 .. g1 and the three pieces far rows after them (all in the job). */
@inline function streamsLegacy(min: bool, five: bool, offset: i32, job: usize, g0: i32, g1: i32, far: i32): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const sb = <usize>(n >> 5) * groupBytes(min, five);
  for (let g = g0; g < g1; g += 8) strips(min, five, offset, 4, j.y + (<usize>(g - j.r0) << 2), <usize>far << 2, j.x, j.w + <usize>(g >> 3) * sb, <usize>(far >> 3) * sb, n);
}

/** One token row in four streams far rows apart (streamsLegacy), fn the legacy kernel's index; or 2 to 7 token rows (legacyRows). */
export function matmul_legacy_streams(fn: i32, job: usize, g0: i32, g1: i32, far: i32): void {
  if (changetype<Job>(job).rows > 1) legacyRows(fn, job, g0, g1, far);
  else if (fn == Q4_0) streamsLegacy(false, false, -8, job, g0, g1, far);
  else if (fn == Q4_1) streamsLegacy(true, false, 0, job, g0, g1, far);
  else if (fn == Q5_0) streamsLegacy(false, true, -16, job, g0, g1, far);
  else streamsLegacy(true, true, 0, job, g0, g1, far);
}

function legacyRows(fn: i32, job: usize, g0: i32, g1: i32, far: i32): void {
  if (fn == Q4_0) rowsQ4_0(job, g0, g1, far);
  else if (fn == Q4_1) rowsQ4_1(job, g0, g1, far);
  else if (fn == Q5_0) rowsQ5_0(job, g0, g1, far);
  else rowsQ5_1(job, g0, g1, far);
}

// Each type a function of its own: JavaScriptCore allocates registers a function at a time.
function rowsQ4_0(job: usize, g0: i32, g1: i32, far: i32): void {
  streamsRows(false, false, -8, job, g0, g1, far);
}
function rowsQ4_1(job: usize, g0: i32, g1: i32, far: i32): void {
  streamsRows(true, false, 0, job, g0, g1, far);
}
function rowsQ5_0(job: usize, g0: i32, g1: i32, far: i32): void {
  streamsRows(false, true, -16, job, g0, g1, far);
}
function rowsQ5_1(job: usize, g0: i32, g1: i32, far: i32): void {
  streamsRows(true, true, 0, job, g0, g1, far);
}

/**
 * A half strip against four token rows from xq (qb apart), outputs of token t at yo + t * ys:
 * each quad of nibbles (and each fifth bit) is unpacked once for the four tokens, each token's
 * dot as q4Sub's (two passes of two quads; q5 widens after each, q4 after both). y holds the
 * running f32 sums (the same additions, in the same order, as half1's registers).
 */
@inline function half4(min: bool, five: bool, offset: i32, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + half * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + half * 16;
  const sr = quadScales(xq, n);
  const ur = quadSums(xq, n, 5);
  const z = i32x4.splat(0);
  for (let t: usize = 0; t < 4; t++) v128.store(yo + t * ys, z);
  for (let c = 0; c < blocks; c++) {
    const g = sp + <usize>c * gb;
    const w = g + nib0;
    const xb = xq + (<usize>c << 7);
    let h = five ? v128.load(g + bits0) : z;
    let i0 = z, i1 = z, i2 = z, i3 = z;
    let s0 = z, s1 = z, s2 = z, s3 = z;
    for (let p: usize = 0; p < 64; p += 32) {
      for (let u = p; u < p + 32; u += 16) {
        const v = v128.load(w + u);
        const lo = lowOf(five, v, h);
        const hi = highOf(five, v, h);
        if (five) h = next2(h);
        const x = xb + (u << 1);
        s0 = dot2(s0, x, lo, hi);
        s1 = dot2(s1, x + qb, lo, hi);
        s2 = dot2(s2, x + 2 * qb, lo, hi);
        s3 = dot2(s3, x + 3 * qb, lo, hi);
      }
      if (five) {
        i0 = i32x4.add(i0, widen(s0));
        i1 = i32x4.add(i1, widen(s1));
        i2 = i32x4.add(i2, widen(s2));
        i3 = i32x4.add(i3, widen(s3));
        s0 = z; s1 = z; s2 = z; s3 = z;
      }
    }
    if (!five) {
      i0 = widen(s0);
      i1 = widen(s1);
      i2 = widen(s2);
      i3 = widen(s3);
    }
    const dq = f16at(g + (half << 3));
    const dm = min ? f16at(g + 16 + (half << 3)) : z;
    const cs = <usize>c << 2;
    addTerm(yo, term(min, offset, i0, dq, dm, sr + cs, blockSum(ur, c)));
    addTerm(yo + ys, term(min, offset, i1, dq, dm, sr + qb + cs, blockSum(ur + qb, c)));
    addTerm(yo + 2 * ys, term(min, offset, i2, dq, dm, sr + 2 * qb + cs, blockSum(ur + 2 * qb, c)));
    addTerm(yo + 3 * ys, term(min, offset, i3, dq, dm, sr + 3 * qb + cs, blockSum(ur + 3 * qb, c)));
  }
}

/**
 * A half strip against eight token rows from xq (qb apart), outputs of token t at yo + t * ys:
 * half4's sums, token by token (blockN over the blocks). Against half4 twice (quad by quad for
 * four tokens), one thread, alternating builds, AMD EPYC: 8 token rows q4_0 1.17-1.27x, q4_1
 * 1.22-1.41x, q5_0 1.24-1.45x, q5_1 1.45-1.83x; 512 rows q4_0 1.09-1.12x, q5_1 1.21-1.32x.
 */
@inline function half8(min: bool, five: bool, offset: i32, yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, half: usize, n: i32): void {
  const blocks = n >> 5;
  const gb = groupBytes(min, five);
  const z = i32x4.splat(0);
  for (let t: usize = 0; t < 8; t++) v128.store(yo + t * ys, z);
  for (let c = 0; c < blocks; c++) blockN(min, five, offset, yo, ys, xq, qb, sp + <usize>c * gb, half, c, n, 8);
}

/**
 * Block c (group g) of a half strip against `count` token rows from xq (qb apart): each token's
 * term added to its running sums at yo + t * ys (half1's, in its order). The block's four quads are
 * unpacked once into eight registers, then each token in turn runs its eight dots against them
 * from one pointer at constant offsets (as kquants.ts' q4BlockN).
 */
@inline function blockN(min: bool, five: bool, offset: i32, yo: usize, ys: usize, xq: usize, qb: usize, g: usize, half: usize, c: i32, n: i32, count: i32): void {
  const nib0: usize = <usize>(16 + (min ? 16 : 0)) + half * 64;
  const bits0: usize = <usize>(144 + (min ? 16 : 0)) + half * 16;
  const z = i32x4.splat(0);
  const w = g + nib0;
  const hb = five ? v128.load(g + bits0) : z;
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
  const dq = f16at(g + (half << 3));
  const dm = min ? f16at(g + 16 + (half << 3)) : z;
  const cs = <usize>c << 2;
  let x = xq + (<usize>c << 7);
  let o = yo;
  for (let t = 0; t < count; t++) {
    // q4 adds all 8 pairs a lane before widening; q5 widens after 4 (THE RELAXED DOT).
    let q = rdot(i16x8.relaxed_dot_i8x16_i7x16_s(v128.load(x), l0), v128.load(x, 16), h0);
    q = rdot(rdot(q, v128.load(x, 32), l1), v128.load(x, 48), h1);
    let i: v128;
    if (five) {
      i = widen(q);
      q = rdot(i16x8.relaxed_dot_i8x16_i7x16_s(v128.load(x, 64), l2), v128.load(x, 80), h2);
      q = rdot(rdot(q, v128.load(x, 96), l3), v128.load(x, 112), h3);
      i = i32x4.add(i, widen(q));
    } else {
      q = rdot(rdot(q, v128.load(x, 64), l2), v128.load(x, 80), h2);
      q = rdot(rdot(q, v128.load(x, 96), l3), v128.load(x, 112), h3);
      i = widen(q);
    }
    // The row's start from x, not x from a stepping row: that measured 0.81-0.97x for q4_0
    // (one thread, 8 token rows, alternating builds): JavaScriptCore's code differs.
    const row = x - (<usize>c << 7);
    addTerm(o, term(min, offset, i, dq, dm, quadScales(row, n) + cs, blockSum(quadSums(row, n, 5), c)));
    x += qb;
    o += ys;
  }
}

/**
 * 2 to 7 token rows (a small decode batch) in THE STREAMS (dispatch.ts): strips g0 .. g1 and the
 * three runs far rows after them in step, block c of each in turn, both halves, for every token
 * (blockN). Each row's sum keeps THE LEGACY ORDER: the same bits. Strip after strip (half8, half4,
 * strip1) a batch read each strip as one stream a thread, and two tokens took 2.0x one token's
 * time (1B Q4_0, Intel Xeon, two threads).
 */
@inline function streamsRows(min: bool, five: bool, offset: i32, job: usize, g0: i32, g1: i32, far: i32): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const rows = j.rows;
  const gb = groupBytes(min, five);
  const sb = <usize>(n >> 5) * gb;
  const ss = <usize>(far >> 3) * sb;
  const so = <usize>far << 2;
  const ys = <usize>j.d << 2;
  const qb = qRowBytes(n);
  for (let g = g0; g < g1; g += 8) {
    const yo = j.y + (<usize>(g - j.r0) << 2);
    const sp = j.w + <usize>(g >> 3) * sb;
    zeroRuns(yo, so, ys, <usize>rows);
    for (let c = 0; c < (n >> 5); c++) {
      for (let s: usize = 0; s < 4; s++) {
        const gs = sp + s * ss + <usize>c * gb;
        blockN(min, five, offset, yo + s * so, ys, j.x, qb, gs, 0, c, n, rows);
        blockN(min, five, offset, yo + s * so + 16, ys, j.x, qb, gs, 1, c, n, rows);
      }
    }
  }
}

/** One block's term for one token: f32(I) * (d * s) (+ f32(X) * (m * s)), I from the dot i, s at sp, X = xs. */
@inline function term(min: bool, offset: i32, i: v128, dq: v128, dm: v128, sp: usize, xs: i32): v128 {
  if (offset != 0) i = i32x4.add(i, i32x4.splat(offset * xs));
  const s = f32x4.splat(load<f32>(sp));
  let t = f32x4.mul(f32x4.convert_i32x4_s(i), f32x4.mul(dq, s));
  if (min) t = f32x4.add(t, f32x4.mul(f32x4.convert_i32x4_s(i32x4.splat(xs)), f32x4.mul(dm, s)));
  return t;
}

@inline function addTerm(yo: usize, t: v128): void {
  v128.store(yo, f32x4.add(v128.load(yo), t));
}

/**
 * Rows g0 .. g1 of the matrix at w (a thread's share) against every quantized token row at xq;
 * row g's outputs go to column g - r0 of y. Whole strips take eight tokens at a time per half
 * strip (half8), then four (half4), then one at a time (strip1); a row of a strip not wholly in
 * the range computes its half and keeps its lane (the same sum).
 */
@inline function matmulLegacy(min: bool, five: bool, offset: i32, job: usize, g0: i32, g1: i32): void {
  const j = changetype<Job>(job);
  const y = j.y;
  const xq = j.x;
  const w = j.w;
  const rows = j.rows;
  const n = j.n;
  const d = j.d;
  const r0 = j.r0;
  const sb = <usize>(n >> 5) * groupBytes(min, five);
  const qb = qRowBytes(n);
  const ys = <usize>d << 2;
  let g = g0;
  while (g < g1) {
    const sp = w + <usize>(g >> 3) * sb;
    if ((g & 7) == 0 && g + 8 <= g1) {
      let r = 0;
      for (; r + 8 <= rows; r += 8) {
        const yr = y + <usize>r * ys + (<usize>(g - r0) << 2);
        const xr = xq + <usize>r * qb;
        half8(min, five, offset, yr, ys, xr, qb, sp, 0, n);
        half8(min, five, offset, yr + 16, ys, xr, qb, sp, 1, n);
      }
      for (; r + 4 <= rows; r += 4) {
        const yr = y + <usize>r * ys + (<usize>(g - r0) << 2);
        const xr = xq + <usize>r * qb;
        half4(min, five, offset, yr, ys, xr, qb, sp, 0, n);
        half4(min, five, offset, yr + 16, ys, xr, qb, sp, 1, n);
      }
      for (; r < rows; r++) strip1(min, five, offset, y + <usize>r * ys + (<usize>(g - r0) << 2), xq + <usize>r * qb, sp, n);
      g += 8;
      continue;
    }
    oneLane(min, five, offset, y, xq, w, rows, n, ys, qb, sb, r0, g);
    g++;
  }
}

/** Row g alone (a strip not wholly in the range): its half strip's sums, its own lane kept. */
@inline function oneLane(min: bool, five: bool, offset: i32, y: usize, xq: usize, w: usize, rows: i32, n: i32, ys: usize, qb: usize, sb: usize, r0: i32, g: i32): void {
  const sp = w + <usize>(g >> 3) * sb;
  const lane = g & 3;
  for (let r = 0; r < rows; r++) {
    const v = half1(min, five, offset, xq + <usize>r * qb, sp, <usize>((g >> 2) & 1), n);
    const o = y + <usize>r * ys + (<usize>(g - r0) << 2);
    if (lane == 0) store<f32>(o, f32x4.extract_lane(v, 0));
    else if (lane == 1) store<f32>(o, f32x4.extract_lane(v, 1));
    else if (lane == 2) store<f32>(o, f32x4.extract_lane(v, 2));
    else store<f32>(o, f32x4.extract_lane(v, 3));
  }
}

export function matmul_q4_0(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(false, false, -8, job, g0, g1);
}

export function matmul_q4_1(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(true, false, 0, job, g0, g1);
}

export function matmul_q5_0(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(false, true, -16, job, g0, g1);
}

export function matmul_q5_1(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmulLegacy(true, true, 0, job, g0, g1);
}
