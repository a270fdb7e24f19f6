// q8_0 weights against q8_0-quantized activations, in integers (as ggml's q8_0 x q8_0 dot does).
//
// THE Q8 ORDER (q8_0 only; the other dtypes keep THE ORDER in matmul.ts). Each token row x is
// first quantized by quantize_q8_rows, once per dispatch, in 32-element blocks: a = max |x_j| of the
// block, scale s = a / 127, q_j = nearest-even(x_j * (s == 0 ? 0 : 1 / s)), saturated to i16
// (every step in f32; q lies in [-127, 127] unless 1 / s overflows, as for a subnormal s). Then
//
//   y = sum over blocks b, in order, of  f32(I_b) * (wscale_b * s_b)
//
// where I_b = sum_j w_j q_j is the block's exact integer dot (in i32 whatever q is; the order
// inside a block does not matter; |I_b| < 2^24 unless q saturated, so f32(I_b) is exact, and
// otherwise rounds to nearest even like JS's Math.fround), wscale_b the weights' f16 scale made
// f32, every product and sum rounded to f32 (WebAssembly never fuses them), starting from 0. One
// running sum per output row: it depends only on the row's weights and its own token row, never
// on the tile, the batch or the thread. matmulQ8Ref in matmul.ts states it in plain JS.
//
// QUANTIZED X: the values as i16 (widened once here, so the inner loop is i32x4.dot_i16x8_s against
// them), each pair (j, j + 1) splatted over a whole v128 (16 bytes a pair: the tiles of several
// tokens load it as it is, where a load32_splat would cost a shuffle per pair per strip; measured
// faster even for a 512-token prefill, whose x then outgrows L2), then the rest of the row (below).
// The rows of a dispatch go in quads, and the last rows % 4 alone. A quad of rows 4u .. 4u + 3
// takes 4 qRowBytes(n) from xq + 4u qRowBytes(n): first the four rows' pairs interleaved, pair p of
// row t at p * 64 + t * 16, so the four-token tile reads all four at constant offsets from one
// pointer (a wasm address is one register plus a constant, so three token pointers had cost an add
// each per pair: 30 instructions per 64 multiply-adds in the Air, 27 now; a 1B Q8_0 model's
// 512-token prefill took 7.86 s against 8.74, AMD EPYC, two threads, bench/decode-ab.ts
// PREFILL=512, four alternating rounds), then the four rests one after another. A row alone (r >=
// rows & ~3) takes qRowBytes(n) from xq + r qRowBytes(n): its pairs 16 bytes apart, then its rest.
// A row's rest: the n / 32 block scales as f32 (f32 rather than ggml's f16: this is scratch, not
// storage, so the extra bytes cost nothing and a rounding and a conversion per block go away), then
// (16-aligned) the n values again as i16 in order: the one-token kernel (strip1) loads each pair
// from there with a 4-byte splat, the same v128 from a quarter of the bytes (the splatted pairs, 8
// n bytes, outgrow L1 beside the streaming weights from n = 4096 on; see kquants.ts' COMPACT X).
// MatmulKernel places it in the dispatch's own space, above the permanent allocations: nothing per
// token.
//
// The weights are in matmul.ts's STRIP LAYOUT: a group is one 32-weight block of 8 rows, the 8
// f16 scales (one v128, widened once per group), then rows 0..3 and rows 4..7, each half as 16
// pairs of weights (j, j + 1) of its four rows, 8 bytes a pair (strip-layout.ts's q8Slot). So one
// v128.load8x8_s and one i32x4.dot_i16x8_s against x's pair splatted give four rows' partial
// sums in four lanes: no reduction across lanes, ever.

import { f16ext, f16extScale, f16ToF32 } from "./f16";
import { Job } from "./job";
import { storeStrips, zeroRuns } from "./kquants";

/** Rows per strip. */
const S: i32 = 8;
/** Bytes of one group: 8 f16 scales, then 8 rows of 32 int8. */
const GROUP: usize = 272;

/** Bytes of one quantized token row of n (a multiple of 32). */
@inline function qRowBytes(n: i32): usize {
  return compactOffset(n) + (((<usize>n << 1) + 15) & ~15);
}

/** Where a quantized row's compact values start: after the splatted pairs and the scales, 16-aligned. */
@inline function compactOffset(n: i32): usize {
  return (<usize>(8 * n + (n >> 3)) + 15) & ~15;
}

/** qRowBytes, for MatmulKernel to size the space (one statement of the layout, here). */
export function q8_row_bytes(n: i32): i32 {
  return <i32>qRowBytes(n);
}

/** Bytes of a row's rest (scales, the compact values) after its 8 n bytes of pairs. */
@inline function restBytes(n: i32): usize {
  return qRowBytes(n) - (<usize>n << 3);
}

/** Whether row r of `rows` lies in a quad (the first rows & ~3 of them) rather than alone. */
@inline function inQuad(r: i32, rows: i32): bool {
  return r < (rows & ~3);
}

/** Where row r (of `rows` at xq) has its pair 0; the next pair is pairStride(r, rows) on. */
@inline function pairsOf(xq: usize, r: i32, rows: i32, n: i32): usize {
  const qb = qRowBytes(n);
  if (inQuad(r, rows)) return xq + <usize>(r >> 2) * (qb << 2) + (<usize>(r & 3) << 4);
  return xq + <usize>r * qb;
}

/** Bytes from one pair of row r to its next: 64 in a quad, 16 alone. */
@inline function pairStride(r: i32, rows: i32): usize {
  return inQuad(r, rows) ? 64 : 16;
}

/** Where row r (of `rows` at xq) has its rest: its block scales first. */
@inline function restOf(xq: usize, r: i32, rows: i32, n: i32): usize {
  const qb = qRowBytes(n);
  if (inQuad(r, rows)) return xq + <usize>(r >> 2) * (qb << 2) + (<usize>n << 5) + <usize>(r & 3) * restBytes(n);
  return xq + <usize>r * qb + (<usize>n << 3);
}

/** Where a rest's compact values start (compactOffset from the row's place). */
@inline function compactAt(rest: usize, n: i32): usize {
  return rest + compactOffset(n) - (<usize>n << 3);
}

/**
 * Token rows r0 .. r1 of `rows` rows of n f32 (row 0 at x) into the quantized layout of all
 * `rows` at dst (see QUANTIZED X). Each row alone, so any split of the rows gives the same bytes.
 * n must be a multiple of 32.
 */
export function quantize_q8_rows(dst: usize, x: usize, r0: i32, r1: i32, rows: i32, n: i32): void {
  const blocks = n >> 5;
  for (let r = r0; r < r1; r++) {
    const xr = x + <usize>r * (<usize>n << 2);
    const pr = pairsOf(dst, r, rows, n);
    const ps = pairStride(r, rows);
    const sr = restOf(dst, r, rows, n);
    const cr = compactAt(sr, n);
    for (let b = 0; b < blocks; b++) quantizeBlock(pr + <usize>b * (ps << 4), ps, sr + (<usize>b << 2), xr + (<usize>b << 7), cr + (<usize>b << 6));
  }
}

/** rows token rows of n f32 at x into the quantized layout at dst (quantize_q8_rows, all of them). */
export function quantize_q8_x(dst: usize, x: usize, rows: i32, n: i32): void {
  quantize_q8_rows(dst, x, 0, rows, rows, n);
}

/** One 32-element block of f32 at xp into 16 splatted pairs of i16 from qp (ps bytes apart) and 32 i16 at cp, its scale at sp. */
@inline function quantizeBlock(qp: usize, ps: usize, sp: usize, xp: usize, cp: usize): void {
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
    const q = i16x8.narrow_i32x4_s(lo, hi);
    v128.store(cp + (i >> 1), q);
    const o = qp + (i >> 3) * ps;
    v128.store(o, i32x4.shuffle(q, q, 0, 0, 0, 0));
    v128.store(o + ps, i32x4.shuffle(q, q, 1, 1, 1, 1));
    v128.store(o + 2 * ps, i32x4.shuffle(q, q, 2, 2, 2, 2));
    v128.store(o + 3 * ps, i32x4.shuffle(q, q, 3, 3, 3, 3));
  }
}

/** acc + f32(I) * (wscale * xscale), lane by lane (four rows' running sums). */
@inline function addBlock(acc: v128, sums: v128, wscale: v128, xscale: v128): v128 {
  return f32x4.add(acc, f32x4.mul(f32x4.convert_i32x4_s(sums), f32x4.mul(wscale, xscale)));
}

/**
 * The block sums I of a half strip (rows 4 half .. 4 half + 3) for the block at g: its 128 weight
 * bytes against the block's 32 x at xp (compact pairs), four rows' exact i32 sums.
 */
@inline function halfSums(g: usize, half: usize, xp: usize): v128 {
  const w = g + 16 + half * 128;
  let la = i32x4.splat(0), lb = la;
  for (let q = w, x = xp; q < w + 128; q += 16, x += 8) {
    la = i32x4.add(la, i32x4.dot_i16x8_s(v128.load8x8_s(q), v128.load32_splat(x)));
    lb = i32x4.add(lb, i32x4.dot_i16x8_s(v128.load8x8_s(q, 8), v128.load32_splat(x, 4)));
  }
  return i32x4.add(la, lb);
}

/** A half strip's four running sums plus the block at g (addBlock: its sums, its rows' f16 scales, x's scale xs). */
@inline function addHalf(acc: v128, g: usize, half: usize, xp: usize, xs: v128): v128 {
  const ws = v128.load(g);
  return addBlock(acc, halfSums(g, half, xp), f16extScale(half == 0 ? i32x4.extend_low_i16x8_s(ws) : i32x4.extend_high_i16x8_s(ws)), xs);
}

/**
 * The strip at sp against one token row whose rest is at rest, block by block; its 8 rows give
 * their outputs at yo, yo + 4, ... Per row, one running f32 sum, plus per block f32(I) * (wscale *
 * xscale) (THE Q8 ORDER in matmul.ts). A one-token chunk takes four strips in step (strip4,
 * dispatch.ts' THE STREAMS); this takes a batch's odd rows and a piece that a job's ends cut.
 */
@inline function strip1(yo: usize, rest: usize, sp: usize, n: i32): void {
  let y0 = f32x4.splat(0);
  let y1 = y0;
  let xp = compactAt(rest, n);
  let sp4 = rest;
  for (let c = 0; c < n >> 5; c++) {
    const xs = v128.load32_splat(sp4);
    const g = sp + <usize>c * GROUP;
    y0 = addHalf(y0, g, 0, xp, xs);
    y1 = addHalf(y1, g, 1, xp, xs);
    xp += 64;
    sp4 += 4;
  }
  v128.store(yo, y0);
  v128.store(yo, y1, 16);
}

/**
 * Four strips ss bytes apart (sp, sp + ss, ...) against one token row, in step, block by block:
 * the four strips' half 0 terms, then their half 1 terms, each half's running sum in registers
 * (strip1's additions, in its order); strip t's outputs at yo + t * ys2. Each stream is read in
 * bursts of 128 bytes with seven half terms between, so the lines the prefetcher fetched arrive
 * while the others compute (as kquants.ts' kStrips). Four blocks of each strip a turn (1088 bytes)
 * left the turn's later lines waiting: 1B Q8_0 decode 69.5 -> 57.3 ms a token (1.213x; one block a
 * turn, sums through memory, 1.161x; two 1.103x), bench/decode-ab.ts, Intel Xeon, 3 rounds,
 * decode-ab.s18-q8-*.json.
 */
@inline function strip4(yo: usize, ys2: usize, rest: usize, sp: usize, ss: usize, n: i32): void {
  const blocks = n >> 5;
  let a0 = f32x4.splat(0);
  let a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  let xp = compactAt(rest, n);
  let sp4 = rest;
  for (let c = 0; c < blocks; c++) {
    const xs = v128.load32_splat(sp4);
    const g = sp + <usize>c * GROUP;
    a0 = addHalf(a0, g, 0, xp, xs);
    b0 = addHalf(b0, g + ss, 0, xp, xs);
    c0 = addHalf(c0, g + 2 * ss, 0, xp, xs);
    d0 = addHalf(d0, g + 3 * ss, 0, xp, xs);
    a1 = addHalf(a1, g, 1, xp, xs);
    b1 = addHalf(b1, g + ss, 1, xp, xs);
    c1 = addHalf(c1, g + 2 * ss, 1, xp, xs);
    d1 = addHalf(d1, g + 3 * ss, 1, xp, xs);
    xp += 64;
    sp4 += 4;
  }
  storeStrips(4, yo, ys2, a0, a1, b0, b1, c0, c1, d0, d1);
}

/** One token row in four streams far rows apart: whole strips g0 .. g1 and the three pieces after them, all in the job. */
export function matmul_q8_0_streams(job: usize, g0: i32, g1: i32, far: i32): void {
  const j = changetype<Job>(job);
  if (j.rows > 1) {
    streamsRows(j, g0, g1, far);
    return;
  }
  const n = j.n;
  const sb = <usize>(n >> 5) * GROUP;
  const rest = restOf(j.x, 0, 1, n);
  for (let g = g0; g < g1; g += S) strip4(j.y + (<usize>(g - j.r0) << 2), <usize>far << 2, rest, j.w + <usize>(g >> 3) * sb, <usize>(far >> 3) * sb, n);
}

/**
 * 2 to 7 token rows (a small decode batch) in THE STREAMS (dispatch.ts): strips g0 .. g1 and the
 * three runs far rows after them in step, block c of each in turn, for the first four tokens (one
 * quad, from four rows) and then the one to three rows alone while the block is in L1 (aloneBlock).
 * Each row's sum keeps THE Q8 ORDER: the same bits. Strip after strip, one thread read a 4-token q8_0
 * matrix from DRAM at 21.5 GMAC/s against 32 from L2 (Intel Xeon, bench/kernel-bounds.ts ROWS=4),
 * the ring of THE WEIGHTS AHEAD included. In the streams, two threads, Intel Xeon,
 * bench/decode-ab.ts, three alternating rounds: a step of 4 sequences 1B Q8_0 114.2 -> 92.5 ms
 * (1.235x), 8B 672.7 -> 557.3 ms (1.207x); of 6, 1B 1.116x.
 */
function streamsRows(j: Job, g0: i32, g1: i32, far: i32): void {
  const rows = j.rows;
  if (rows == 2) runs2(j, g0, g1, far);
  else if (rows == 3) runs3(j, g0, g1, far);
  else if (rows == 4) runs4(j, g0, g1, far);
  else if (rows == 5) runs5(j, g0, g1, far);
  else if (rows == 6) runs6(j, g0, g1, far);
  else runs7(j, g0, g1, far);
}

// Each row count a function of its own: JavaScriptCore allocates registers a function at a time.
function runs2(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, false, 2);
}
function runs3(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, false, 3);
}
function runs4(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, true, 0);
}
function runs5(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, true, 1);
}
function runs6(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, true, 2);
}
function runs7(j: Job, g0: i32, g1: i32, far: i32): void {
  smallRuns(j, g0, g1, far, true, 3);
}

/** streamsRows with a quad of rows or none, then `alone` rows (constants: a token's sums are registers). */
@inline function smallRuns(j: Job, g0: i32, g1: i32, far: i32, quad: bool, alone: i32): void {
  const n = j.n;
  const xq = j.x;
  const ys = <usize>j.d << 2;
  const qb = qRowBytes(n);
  const rb = restBytes(n);
  const sb = <usize>(n >> 5) * GROUP;
  const ss = <usize>(far >> 3) * sb;
  const so = <usize>far << 2;
  const blocks = n >> 5;
  // The rows alone, after the quad's four (QUANTIZED X).
  const xa = quad ? xq + (qb << 2) : xq;
  const ya: usize = quad ? 4 * ys : 0;
  for (let g = g0; g < g1; g += S) {
    const yo = j.y + (<usize>(g - j.r0) << 2);
    const sp = j.w + <usize>(g >> 3) * sb;
    zeroRuns(yo, so, ys, <usize>((quad ? 4 : 0) + alone));
    for (let c = 0; c < blocks; c++) {
      const xp = xq + (<usize>c << 10);
      const sp4 = xq + (<usize>n << 5) + (<usize>c << 2);
      for (let s: usize = 0; s < 4; s++) {
        const g8 = sp + s * ss + <usize>c * GROUP;
        const ws = v128.load(g8);
        const wlo = f16ext(i32x4.extend_low_i16x8_s(ws));
        const whi = f16ext(i32x4.extend_high_i16x8_s(ws));
        const w = g8 + 16;
        const yt = yo + s * so;
        if (quad) quadBlock(yt, ys, w, wlo, whi, xp, sp4, rb);
        if (alone > 0) aloneBlock(yt + ya, ys, w, wlo, whi, xa, qb, c, n, alone);
      }
    }
  }
}

/**
 * A block (weights at w, scales wlo whi) against a quad of token rows (their pairs from xp, scales
 * from sp4, rb apart), added to their running sums at yo + t * ys (addBlockAt): the plain pass of
 * tiles8x4 and of the streams' quads. (tiles8x4's pass that copies the ring keeps its own loop: a
 * test inside this one, or one function taking either, lost the ring's gain under JavaScriptCore.
 * Calling this for tiles8x4's plain passes measured alike, bench/decode-ab.ts, Intel Xeon, three
 * alternating rounds: 8B Q8_0 8 sequences 0.996x, 1B 1.004x, a 1B 512-token prefill 0.992x.)
 */
@inline function quadBlock(yo: usize, ys: usize, w: usize, wlo: v128, whi: v128, xp: usize, sp4: usize, rb: usize): void {
  let a0 = i32x4.splat(0), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (let q = w, x = xp; q < w + 128; q += 8, x += 64) {
    const lo = v128.load8x8_s(q);
    const hi = v128.load8x8_s(q, 128);
    let v = v128.load(x);
    a0 = i32x4.add(a0, i32x4.dot_i16x8_s(lo, v));
    a1 = i32x4.add(a1, i32x4.dot_i16x8_s(hi, v));
    v = v128.load(x, 16);
    b0 = i32x4.add(b0, i32x4.dot_i16x8_s(lo, v));
    b1 = i32x4.add(b1, i32x4.dot_i16x8_s(hi, v));
    v = v128.load(x, 32);
    c0 = i32x4.add(c0, i32x4.dot_i16x8_s(lo, v));
    c1 = i32x4.add(c1, i32x4.dot_i16x8_s(hi, v));
    v = v128.load(x, 48);
    d0 = i32x4.add(d0, i32x4.dot_i16x8_s(lo, v));
    d1 = i32x4.add(d1, i32x4.dot_i16x8_s(hi, v));
  }
  addBlockAt(yo, a0, a1, wlo, whi, sp4);
  addBlockAt(yo + ys, b0, b1, wlo, whi, sp4 + rb);
  addBlockAt(yo + 2 * ys, c0, c1, wlo, whi, sp4 + 2 * rb);
  addBlockAt(yo + 3 * ys, d0, d1, wlo, whi, sp4 + 3 * rb);
}

/**
 * Block c (weights at w, scales wlo whi) against `count` (1 to 3, a constant) token rows alone from
 * xa, qb apart (tile8x2's sums, each pair of weights widened once for all of them), added to their
 * running sums at yo + t * ys (addBlockAt).
 */
@inline function aloneBlock(yo: usize, ys: usize, w: usize, wlo: v128, whi: v128, xa: usize, qb: usize, c: i32, n: i32, count: i32): void {
  let i0 = i32x4.splat(0), i1 = i0, i2 = i0, i3 = i0, i4 = i0, i5 = i0;
  for (let q = w, x = xa + (<usize>c << 8); q < w + 128; q += 8, x += 16) {
    const lo = v128.load8x8_s(q);
    const hi = v128.load8x8_s(q, 128);
    let v = v128.load(x);
    i0 = i32x4.add(i0, i32x4.dot_i16x8_s(lo, v));
    i1 = i32x4.add(i1, i32x4.dot_i16x8_s(hi, v));
    if (count > 1) {
      v = v128.load(x + qb);
      i2 = i32x4.add(i2, i32x4.dot_i16x8_s(lo, v));
      i3 = i32x4.add(i3, i32x4.dot_i16x8_s(hi, v));
    }
    if (count > 2) {
      v = v128.load(x + 2 * qb);
      i4 = i32x4.add(i4, i32x4.dot_i16x8_s(lo, v));
      i5 = i32x4.add(i5, i32x4.dot_i16x8_s(hi, v));
    }
  }
  const sp4 = xa + (<usize>n << 3) + (<usize>c << 2);
  addBlockAt(yo, i0, i1, wlo, whi, sp4);
  if (count > 1) addBlockAt(yo + ys, i2, i3, wlo, whi, sp4 + qb);
  if (count > 2) addBlockAt(yo + 2 * ys, i4, i5, wlo, whi, sp4 + 2 * qb);
}

/** Row k of the strip at sp against one quantized token row, its rest at rest (the same sum as strip1's). */
@inline function row1(rest: usize, sp: usize, k: i32, n: i32): f32 {
  const blocks = n >> 5;
  let acc: f32 = 0;
  let g = sp;
  let xp = compactAt(rest, n);
  let sp4 = rest;
  const w0 = <usize>(16 + ((k >> 2) << 7) + ((k & 3) << 1));
  for (let c = 0; c < blocks; c++) {
    let i = 0;
    for (let p: usize = 0; p < 16; p++) {
      const w = g + w0 + (p << 3);
      const x = xp + (p << 2);
      i += <i32>load<i8>(w) * <i32>load<i16>(x) + <i32>load<i8>(w, 1) * <i32>load<i16>(x, 2);
    }
    acc += <f32>i * (f16ToF32(<u32>load<u16>(g + (<usize>k << 1))) * load<f32>(sp4));
    g += GROUP;
    xp += 64;
    sp4 += 4;
  }
  return acc;
}

/**
 * The 8 rows of the strip at sp against two quantized token rows alone (not in a quad), xq and xq
 * + qb; token t's outputs at yo + t * ys. Each pair of weights is widened once for both tokens,
 * and x is read once per strip (a prefill's x streams from beyond L2 once per strip).
 */
@inline function tile8x2(yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, n: i32): void {
  const blocks = n >> 5;
  let la = f32x4.splat(0), ha = la, lb = la, hb = la;
  let g = sp;
  let xp = xq;
  let sp4 = xq + (<usize>n << 3);
  for (let c = 0; c < blocks; c++) {
    const w = g + 16;
    let i0 = i32x4.splat(0), i1 = i0, i2 = i0, i3 = i0;
    for (let q = w, x0 = xp, x1 = xp + qb; q < w + 128; q += 8, x0 += 16, x1 += 16) {
      const lo = v128.load8x8_s(q);
      const hi = v128.load8x8_s(q, 128);
      const xa = v128.load(x0);
      const xb = v128.load(x1);
      i0 = i32x4.add(i0, i32x4.dot_i16x8_s(lo, xa));
      i1 = i32x4.add(i1, i32x4.dot_i16x8_s(hi, xa));
      i2 = i32x4.add(i2, i32x4.dot_i16x8_s(lo, xb));
      i3 = i32x4.add(i3, i32x4.dot_i16x8_s(hi, xb));
    }
    // f16ext, not f16extScale: a q8_0 scale below 2^-14 needs a block's largest |w| below 2^-7,
    // rare in a model's weights, and costs here an assist per four tokens; each way of testing
    // for it (per block, per strip, or converting per strip into scratch) measured 0.77-0.91x on
    // a 1B Q8_0 model's batch of 8. strip1, one token, takes f16extScale at no measured cost.
    const ws = v128.load(g);
    const wlo = f16ext(i32x4.extend_low_i16x8_s(ws));
    const whi = f16ext(i32x4.extend_high_i16x8_s(ws));
    const xsa = v128.load32_splat(sp4);
    const xsb = v128.load32_splat(sp4 + qb);
    la = addBlock(la, i0, wlo, xsa);
    ha = addBlock(ha, i1, whi, xsa);
    lb = addBlock(lb, i2, wlo, xsb);
    hb = addBlock(hb, i3, whi, xsb);
    g += GROUP;
    xp += 256;
    sp4 += 4;
  }
  v128.store(yo, la);
  v128.store(yo, ha, 16);
  v128.store(yo + ys, lb);
  v128.store(yo + ys, hb, 16);
}

/**
 * The 8 rows of the strip at sp against `quads` quads of quantized token rows from xq (4 qb apart;
 * QUANTIZED X); token t's outputs at yo + t * ys. Each pair of weights is widened once for four
 * tokens: 16 dot products and adds per 4 weight loads and widenings, where 8x2 has 8 per 4 (fewer
 * instructions per multiply-add, which is what bounds the integer kernel). The f32 running sums (8
 * a token, beside the 8 integer ones) leave too few registers for the inner loop, so they live in
 * y itself: each block loads, adds and stores them, the same additions in the same order as in
 * registers. Block by block, every four tokens in turn: a block's 272 bytes come from memory once
 * and from L1 for the next four, so its loads meet the dots of the block before. Four tokens over
 * the whole strip, then the next four, had made the first pass a stream with half the work beside
 * it (8 rows of 8192 x 2048 past L3, one thread: 27 GMAC/s, 38 with the weights in L2). This way a
 * 1B Q8_0 model's step of 8 sequences takes 175 ms against 212 (AMD EPYC, two threads,
 * bench/decode-ab.ts, three alternating rounds); alone, that 8192 x 2048 matmul at 8 rows took
 * 0.85-0.90x the time on one or two threads, and at 512 rows 0.77-0.96x.
 *
 * THE WEIGHTS AHEAD (`ahead`, for a decode batch's rows: stripRows). The quads read each block
 * from a ring of three blocks in `ring` (this thread's scratch), and the last quad's pass over
 * block c copies block c + 2 into the ring, one v128 a pair of weights, so the weights come from
 * memory as a steady stream beside the dots where each block's first pass had asked for its five
 * lines at once and then nothing. Copying changes no value read. 8 sequences, two threads, Intel
 * Xeon, bench/decode-ab.ts BATCH=8, three alternating rounds: an 8B Q8_0 step 1026 -> 1000 and
 * 1011 -> 997 ms (1.015-1.026x in two runs), 1B 174 -> 171 ms; the 8-row 14336 x 4096 matmul
 * alone 59 -> 62 GMAC/s (no gain at 4096 x 4096 or 1B's shapes). One block ahead gave
 * the same; four strips in step instead (x from L1 for three of them) 1.01x.
 */
@inline function tiles8x4(yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, n: i32, quads: i32, ring: usize, ahead: bool): void {
  const blocks = n >> 5;
  const z = f32x4.splat(0);
  for (let t: usize = 0; t < <usize>(quads << 2); t++) {
    v128.store(yo + t * ys, z);
    v128.store(yo + t * ys, z, 16);
  }
  const q4 = qb << 2;
  const y4 = ys << 2;
  const rb = restBytes(n);
  // The ring's first two blocks (a strip of one block copies it twice: in range either way).
  if (ahead) for (let k: usize = 0; k < 2 * GROUP; k += 16) v128.store(ring + k, v128.load(sp + (k < <usize>blocks * GROUP ? k : 0)));
  const last = ring + 2 * GROUP;
  let cur = ring;
  let next = last;
  for (let c = 0; c < blocks; c++) {
    const g = ahead ? cur : sp + <usize>c * GROUP;
    // Block c + 2, or past the strip's end its first block again, which nothing reads.
    const from = <usize>c + 2 < <usize>blocks ? sp + (<usize>c + 2) * GROUP : sp;
    const w = g + 16;
    const ws = v128.load(g);
    const wlo = f16ext(i32x4.extend_low_i16x8_s(ws));
    const whi = f16ext(i32x4.extend_high_i16x8_s(ws));
    let xp = xq + (<usize>c << 10);
    let sp4 = xq + (<usize>n << 5) + (<usize>c << 2);
    let yt = yo;
    for (let u = 0; u < quads; u++) {
      if (ahead && u == quads - 1) {
        // The plain pass with the copy beside its loads: a test inside quadBlock's loop (1.00x)
        // and one pass function taking either (59 against 62 GMAC/s, 8 rows of 14336 x 4096)
        // each lost the ring's gain under JavaScriptCore.
        let a0 = i32x4.splat(0), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
        for (let q = w, x = xp, f = from, t = next; q < w + 128; q += 8, x += 64, f += 16, t += 16) {
          v128.store(t, v128.load(f));
          const lo = v128.load8x8_s(q);
          const hi = v128.load8x8_s(q, 128);
          let v = v128.load(x);
          a0 = i32x4.add(a0, i32x4.dot_i16x8_s(lo, v));
          a1 = i32x4.add(a1, i32x4.dot_i16x8_s(hi, v));
          v = v128.load(x, 16);
          b0 = i32x4.add(b0, i32x4.dot_i16x8_s(lo, v));
          b1 = i32x4.add(b1, i32x4.dot_i16x8_s(hi, v));
          v = v128.load(x, 32);
          c0 = i32x4.add(c0, i32x4.dot_i16x8_s(lo, v));
          c1 = i32x4.add(c1, i32x4.dot_i16x8_s(hi, v));
          v = v128.load(x, 48);
          d0 = i32x4.add(d0, i32x4.dot_i16x8_s(lo, v));
          d1 = i32x4.add(d1, i32x4.dot_i16x8_s(hi, v));
        }
        v128.store(next, v128.load(from, 256), 256);
        addBlockAt(yt, a0, a1, wlo, whi, sp4);
        addBlockAt(yt + ys, b0, b1, wlo, whi, sp4 + rb);
        addBlockAt(yt + 2 * ys, c0, c1, wlo, whi, sp4 + 2 * rb);
        addBlockAt(yt + 3 * ys, d0, d1, wlo, whi, sp4 + 3 * rb);
      } else quadBlock(yt, ys, w, wlo, whi, xp, sp4, rb);
      xp += q4;
      sp4 += q4;
      yt += y4;
    }
    cur = cur == last ? ring : cur + GROUP;
    next = next == last ? ring : next + GROUP;
  }
}

/** One token's 8 running sums at yo plus a block (addBlock on rows 0..3 and 4..7), x scale at xs. */
@inline function addBlockAt(yo: usize, lo: v128, hi: v128, wlo: v128, whi: v128, xs: usize): void {
  const s = v128.load32_splat(xs);
  v128.store(yo, addBlock(v128.load(yo), lo, wlo, s));
  v128.store(yo, addBlock(v128.load(yo, 16), hi, whi, s), 16);
}

/**
 * The whole strip at sp against every quantized token row from xq: the quads eight tokens at a
 * time by tiles8x4 (sixteen measured alike), then four; the rows alone two by 8x2 (the strip,
 * 8.5 n bytes, stays in cache while the tokens pass), the odd one by strip1. (4 rows x 4 tokens, which reads x twice per
 * strip, measured slower.) Fewer than 12 rows (a decode batch, or a prefill's tile of 8) read the
 * weights ahead through `ring` (THE WEIGHTS AHEAD); where more tokens share the strip its first
 * pass's wait is a smaller share, and copying for every tile's first eight rows had cost a 1B Q8_0
 * 512-token prefill 1.5% (0.985x; with this bound 1.008x, bench/decode-ab.ts PREFILL=512).
 */
@inline function stripRows(yo: usize, ys: usize, xq: usize, qb: usize, sp: usize, rows: i32, n: i32, ring: usize): void {
  let r = 0;
  if (rows < 12) {
    if (rows >= 8) {
      tiles8x4(yo, ys, xq, qb, sp, n, 2, ring, true);
      r = 8;
    } else if (rows >= 4) {
      tiles8x4(yo, ys, xq, qb, sp, n, 1, ring, true);
      r = 4;
    }
  }
  for (; r + 8 <= rows; r += 8) tiles8x4(yo + <usize>r * ys, ys, xq + <usize>r * qb, qb, sp, n, 2, ring, false);
  if (r + 4 <= rows) {
    tiles8x4(yo + <usize>r * ys, ys, xq + <usize>r * qb, qb, sp, n, 1, ring, false);
    r += 4;
  }
  for (; r + 2 <= rows; r += 2) tile8x2(yo + <usize>r * ys, ys, xq + <usize>r * qb, qb, sp, n);
  for (; r < rows; r++) strip1(yo + <usize>r * ys, restOf(xq, r, rows, n), sp, n);
}

/**
 * Rows g0 .. g1 of the q8_0 matrix at w (a thread's share) against every quantized token row at
 * xq; row g's outputs go to column g - r0 of y. Rows of a strip not wholly in the range go one at
 * a time. n must be a multiple of 32 (the caller checks). `scratch`, this thread's own (at least 32 n
 * bytes, as every dispatch gives), holds the ring of THE WEIGHTS AHEAD (3 x 272 bytes).
 */
export function matmul_q8_0(job: usize, g0: i32, g1: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const y = j.y;
  const xq = j.x;
  const w = j.w;
  const rows = j.rows;
  const n = j.n;
  const d = j.d;
  const r0 = j.r0;
  const sb = <usize>(n >> 5) * GROUP;
  const qb = qRowBytes(n);
  const ys = <usize>d << 2;
  let g = g0;
  for (; g < g1 && ((g & (S - 1)) != 0 || g + S > g1); g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1(restOf(xq, r, rows, n), sp, g & (S - 1), n));
  }
  for (; g + S <= g1; g += S) stripRows(y + (<usize>(g - r0) << 2), ys, xq, qb, w + <usize>(g >> 3) * sb, rows, n, scratch);
  for (; g < g1; g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1(restOf(xq, r, rows, n), sp, g & (S - 1), n));
  }
}
