// Matrix-vector and matrix-matrix kernels of the transformer, in AssemblyScript (built by
// scripts/build-kernels.mjs into ../kernels.wasm; `npm test` fails when that file is not what this
// source builds).
//
//   y[r*d + (g - r0)] = dot(W row g, x row r)   for r < rows, g0 <= g < g1
//
// x and y are f32; W is f32, f16 or bf16 (q8_0 has its own kernel, q8.ts), in the STRIP LAYOUT
// below (MatmulKernel packs every matrix so when it places it). Every argument that names memory
// is a byte offset into the one imported memory. Each kernel takes y, x, w, rows, n, d and r0
// through one pointer to a Job record (job.ts) and reads them into locals at entry; g0, g1 and
// scratch, which differ per chunk and per thread, stay arguments.
//
// THE ORDER. Every f32, f16 or bf16 output, whatever its tile, batch or thread, is summed the
// same way: each weight is first made an f32 exactly (f16 and bf16 fit in f32), then
// four f32 lanes sum j = l (mod 4) for j < n - n % 4, each `s + w * x` rounded after the product
// and after the sum (WebAssembly never fuses them), then (s0 + s1) + (s2 + s3), then the n % 4
// tail one by one. So a 16-bit matrix gives the bits that the f32 kernel gives on its
// dequantized copy, and matmulRef in matmul.ts states the order in plain JS.
//
// THE Q8 ORDER. q8_0 runs in integers (q8.ts, which states it in full), so it does NOT equal the
// f32 kernel on its dequantized copy: each token row is quantized per 32-block to i16 values and an
// f32 scale s = max|x| / 127, each block's integer dot I_b is exact, and an output is one running
// f32 sum from 0 over the blocks in order of f32(I_b) * (weight scale_b * s_b), each product and
// sum rounded. Again per output row only: any tile, batch or thread gives the same bits, and
// matmulQ8Ref in matmul.ts states it in plain JS.
//
// THE STRIP LAYOUT. Rows go in strips of 8 (the last padded with zero rows), and a strip holds its
// rows' weights group by group: group c of rows 0..7 back to back, so a strip is read front to
// back in one stream (eight row streams defeat the prefetcher). A group is
//   f32:       4 weights of each row (16 bytes a row, 128 a group);
//   f16, bf16: 8 weights of each row (16 bytes a row) in the order 0 4 1 5 2 6 3 7, so each
//              32-bit lane holds weight l low and weight l + 4 high and both halves widen in place
//              (bf16 by a multiply or an and, f16 by one 16-bit dot product and an and each;
//              f16 in either coding, plain or f16.ts' THE SHIFTED F16, the same bytes else);
//   q8_0:      one 32-weight block of each row: the 8 f16 scales (16 bytes), then the 8 rows' 32
//              int8 in pairs of weights of four rows (272 bytes a group; q8.ts reads it).
// Weights past the last whole group of a row (n % 4, or n % 8 for 16-bit) follow the groups, row
// by row in their natural order.
//
// Tiles only decide which outputs share the loads: one token row takes whole strips four in step
// (eight sums in flight each; strips4, dispatch.ts' THE STREAMS; strip8x1 where a job's ends cut a
// piece), f16 against x scaled by 2^112 (see F16X, and F16SX for the shifted coding); more token rows
// take 4 weight rows by 2 tokens from an f32 strip, packed dtypes being first dequantized a strip
// at a time into `scratch` (exact, so the bits stay the same).

import { f16bitsHi, f16bitsLo, f16sToF32, f16sx4, f16ToF32, f16x4, rebias, rebiasShifted, top16x4 } from "./f16";
import { BF16, F16, F16S, F32 } from "./dtype-index";
import { Job } from "./job";

/**
 * f16 weights against x scaled by 2^112 (exact while |x| < 2^16): the weights' f32 patterns then
 * need no rebias multiply, and each product w * x is the same real number, so rounds the same.
 */
const F16X: i32 = 4;

/** F16X for f16 placed shifted (f16.ts' THE SHIFTED F16): x scaled by 2^102, exact while |x| < 2^26. */
const F16SX: i32 = 17;

/** 2^112 and 2^102: what x is scaled by against plain and shifted f16 patterns. */
const X112: f32 = reinterpret<f32>(0x77800000);
const X102: f32 = reinterpret<f32>(0x72800000);
/** The bits of 2^16 and 2^26: |x| below them scales by 2^112 and 2^102 exactly. */
const BELOW16: i32 = 0x47800000;
const BELOW26: i32 = 0x4c800000;

/** Rows per strip. */
const S: i32 = 8;

/** Weights of one row in one group. */
@inline function groupLen(dt: i32): i32 {
  if (dt == F32) return 4;
  return 8;
}

/** Bytes of one group (all 8 rows): 16 a row whatever the dtype (4 f32 or 8 16-bit weights). */
const GROUP_BYTES: usize = 128;

/** Weights of a row held in whole groups. */
@inline function mainLen(dt: i32, n: i32): i32 {
  if (dt == F32) return n & ~3;
  return n & ~7;
}

@inline function elemShift(dt: i32): i32 {
  return dt == F32 ? 2 : 1;
}

/** Bytes of one strip of rows of n weights. */
@inline function stripBytes(dt: i32, n: i32): usize {
  return (<usize>(S * n)) << elemShift(dt);
}

/** Where row k's weights past the groups start, in the strip at sp. */
@inline function tailOf(dt: i32, sp: usize, n: i32, k: i32): usize {
  const main = mainLen(dt, n);
  return sp + <usize>(main / groupLen(dt)) * GROUP_BYTES + ((<usize>(k * (n - main))) << elemShift(dt));
}

@inline function fma4(acc: v128, w: v128, x: v128): v128 {
  return f32x4.add(acc, f32x4.mul(w, x));
}

/** Weights 0..3 of a 16-bit group row: the lanes' low halves (f16 see f16bitsLo; bf16 moved up, times 2^16 rather than a shift: see f16ext). */
@inline function lo16(dt: i32, v: v128): v128 {
  if (dt == F16) return rebias(f16bitsLo(v));
  if (dt == F16S) return rebiasShifted(f16bitsLo(v));
  if (dt == F16X || dt == F16SX) return f16bitsLo(v);
  return i32x4.mul(v, i32x4.splat(0x10000));
}

/** Weights 4..7 of a 16-bit group row: the lanes' high halves. */
@inline function hi16(dt: i32, v: v128): v128 {
  if (dt == F16) return rebias(f16bitsHi(v));
  if (dt == F16S) return rebiasShifted(f16bitsHi(v));
  if (dt == F16X || dt == F16SX) return f16bitsHi(v);
  return v128.and(v, i32x4.splat(0xffff0000));
}

/**
 * acc plus row k's weights of the group at g times x, in j order (one group: 4 or 8 weights); x0
 * and x1 are x at xp and xp + 16, loaded once for all the strip's rows.
 */
@inline function groupDot(dt: i32, acc: v128, g: usize, k: i32, x0: v128, x1: v128): v128 {
  if (dt == F32) return fma4(acc, v128.load(g + (<usize>k << 4)), x0);
  const v = v128.load(g + (<usize>k << 4));
  acc = fma4(acc, lo16(dt, v), x0);
  return fma4(acc, hi16(dt, v), x1);
}

/** x at xp + 16 for the 16-bit dtypes' second half group (zero, unused, for the others). */
@inline function x1Of(dt: i32, xp: usize): v128 {
  return dt == F32 ? f32x4.splat(0) : v128.load(xp, 16);
}

/** Weight i of a row's tail at p, as f32. */
@inline function tail1(dt: i32, p: usize, i: i32): f32 {
  if (dt == F32) return load<f32>(p + (<usize>i << 2));
  if (dt == F16) return f16ToF32(<u32>load<u16>(p + (<usize>i << 1)));
  if (dt == F16S) return f16sToF32(<u32>load<u16>(p + (<usize>i << 1)));
  return reinterpret<f32>(<u32>load<u16>(p + (<usize>i << 1)) << 16);
}

/**
 * The end of one dot: a 16-bit row's tail group of 4 (when n % 8 >= 4) into the lanes, the fold
 * (s0 + s1) + (s2 + s3), then w[j] * x[j] for the n % 4 last j in order. tp: the row's tail.
 */
@inline function finish(dt: i32, acc: v128, tp: usize, xRow: usize, n: i32): f32 {
  const main = mainLen(dt, n);
  const n4 = n & ~3;
  if (dt != F32 && main < n4) {
    let w = top16x4(tp);
    if (dt == F16) w = f16x4(w);
    else if (dt == F16S) w = f16sx4(w);
    acc = fma4(acc, w, v128.load(xRow + (<usize>main << 2)));
  }
  let s = (f32x4.extract_lane(acc, 0) + f32x4.extract_lane(acc, 1)) + (f32x4.extract_lane(acc, 2) + f32x4.extract_lane(acc, 3));
  for (let j = n4; j < n; j++) s += tail1(dt, tp, j - main) * load<f32>(xRow + (<usize>j << 2));
  return s;
}

/**
 * The 8 rows of the strip at sp against one token row xr; outputs at yo, yo + 4, ... The groups
 * read x from xq: xr itself, or for F16X xr scaled by 2^112, for F16SX by 2^102 (the tails read xr).
 * The running sums pass through acc (128 bytes) once, before each row's finish.
 */
@inline function strip8x1(dt: i32, yo: usize, xr: usize, sp: usize, n: i32, xq: usize, acc: usize): void {
  const z = f32x4.splat(0);
  for (let i: usize = 0; i < 128; i += 16) v128.store(acc + i, z);
  stripGroups(dt, acc, sp, xq, 0, mainLen(dt, n) / groupLen(dt));
  finishStrip(dt, yo, acc, sp, xr, n);
}

/** The 8 rows' outputs at yo of the strip at sp whose running sums are at acc (finish on each). */
@inline function finishStrip(dt: i32, yo: usize, acc: usize, sp: usize, xr: usize, n: i32): void {
  const td = dt == F16X ? F16 : dt == F16SX ? F16S : dt;
  for (let r = 0; r < S; r++) store<f32>(yo + (<usize>r << 2), finish(td, v128.load(acc + (<usize>r << 4)), tailOf(dt, sp, n, r), xr, n));
}

/**
 * Groups c0 .. c1 of the strip at sp against x from xp (group c0's), the 8 rows' running sums at
 * acc (16 bytes a row) before and after: strip8x1's additions, in its order, for any cut.
 */
@inline function stripGroups(dt: i32, acc: usize, sp: usize, xp: usize, c0: i32, c1: i32): void {
  const gl = groupLen(dt);
  let a0 = v128.load(acc), a1 = v128.load(acc, 16), a2 = v128.load(acc, 32), a3 = v128.load(acc, 48);
  let a4 = v128.load(acc, 64), a5 = v128.load(acc, 80), a6 = v128.load(acc, 96), a7 = v128.load(acc, 112);
  let g = sp + <usize>c0 * GROUP_BYTES;
  for (let c = c0; c < c1; c++) {
    const x0 = v128.load(xp);
    const x1 = x1Of(dt, xp);
    a0 = groupDot(dt, a0, g, 0, x0, x1);
    a1 = groupDot(dt, a1, g, 1, x0, x1);
    a2 = groupDot(dt, a2, g, 2, x0, x1);
    a3 = groupDot(dt, a3, g, 3, x0, x1);
    a4 = groupDot(dt, a4, g, 4, x0, x1);
    a5 = groupDot(dt, a5, g, 5, x0, x1);
    a6 = groupDot(dt, a6, g, 6, x0, x1);
    a7 = groupDot(dt, a7, g, 7, x0, x1);
    g += GROUP_BYTES;
    xp += <usize>gl << 2;
  }
  v128.store(acc, a0);
  v128.store(acc, a1, 16);
  v128.store(acc, a2, 32);
  v128.store(acc, a3, 48);
  v128.store(acc, a4, 64);
  v128.store(acc, a5, 80);
  v128.store(acc, a6, 96);
  v128.store(acc, a7, 112);
}

/**
 * Groups of one strip taken before the next strip's turn in strips4: 256 bytes of weights. Short
 * turns let the prefetcher's lines for a stream arrive while the other three compute (as
 * kquants.ts' kStrips); each turn's 8 sums go through memory, so one group a turn costs more than
 * it gives. 1B F16 decode against 4 groups (512 bytes): 2 groups 1.072x, 1 group 0.936x
 * (bench/decode-ab.ts, Intel Xeon, 3 rounds, decode-ab.s18-f16-turn*-1b.json).
 */
const TURN: i32 = 2;

/**
 * Four strips ss bytes apart (sp, sp + ss, ...) against one token row, in step: TURN groups of
 * each in turn, strip t's 8 running sums at acc + 128 t between turns, then each row's finish;
 * strip t's outputs at yo + t * ys2. Each strip's sums strip8x1's, in its order. Groups read x
 * from xq, the tails from xr (as strip8x1). The turns are a loop: written out four times, 1B F16
 * decode ran at 0.80x the speed (bench/decode-ab.ts, Intel Xeon, 3 rounds: 156.9 against 125.9 ms).
 */
@inline function strips4(dt: i32, yo: usize, ys2: usize, xr: usize, sp: usize, ss: usize, n: i32, xq: usize, acc: usize): void {
  const gl = groupLen(dt);
  const groups = mainLen(dt, n) / gl;
  const z = f32x4.splat(0);
  for (let i: usize = 0; i < 512; i += 16) v128.store(acc + i, z);
  for (let c0 = 0; c0 < groups; c0 += TURN) {
    const c1 = min(c0 + TURN, groups);
    const xp = xq + (<usize>(c0 * gl) << 2);
    for (let t = 0; t < 4; t++) stripGroups(dt, acc + <usize>t * 128, sp + <usize>t * ss, xp, c0, c1);
  }
  for (let t = 0; t < 4; t++) finishStrip(dt, yo + <usize>t * ys2, acc + <usize>t * 128, sp + <usize>t * ss, xr, n);
}

/**
 * strip8x1 on f16 weights and an x not scaled (some |x| >= 2^16), as a function of its own: its
 * dtype a constant here, where a second inlined strip8x1 in matmul with another dtype made
 * AssemblyScript share one local for both and binaryen then kept the dtype tests in the loop.
 */
function strip8x1F16(yo: usize, xr: usize, sp: usize, n: i32, acc: usize): void {
  strip8x1(F16, yo, xr, sp, n, xr, acc);
}

/** strip8x1F16 for shifted f16 (some |x| >= 2^26). */
function strip8x1F16S(yo: usize, xr: usize, sp: usize, n: i32, acc: usize): void {
  strip8x1(F16S, yo, xr, sp, n, xr, acc);
}

/** Row k of the strip at sp against one token row xr. */
@inline function row1x1(dt: i32, xr: usize, sp: usize, k: i32, n: i32): f32 {
  const gl = groupLen(dt);
  const groups = mainLen(dt, n) / gl;
  let a = f32x4.splat(0);
  let g = sp;
  let xp = xr;
  for (let c = 0; c < groups; c++) {
    a = groupDot(dt, a, g, k, v128.load(xp), x1Of(dt, xp));
    g += GROUP_BYTES;
    xp += <usize>gl << 2;
  }
  return finish(dt, a, tailOf(dt, sp, n, k), xr, n);
}

/** Rows h*4 .. h*4+3 of the f32 strip at sp against token rows xa and xa + xs: 8 sums in flight. */
@inline function half4x2(ya: usize, yb: usize, xa: usize, xs: usize, sp: usize, h: i32, n: i32): void {
  const groups = n >> 2;
  let a0 = f32x4.splat(0), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  let g = sp + (<usize>h << 6);
  let xp = xa;
  // Two groups an iteration (the second skipped past the last group): half the loop's overhead,
  // 4-11% faster than one, the same sums in the same order.
  for (let c = 0; c < groups; c += 2) {
    let x0 = v128.load(xp);
    let x1 = v128.load(xp + xs);
    let u = v128.load(g);
    a0 = fma4(a0, u, x0);
    b0 = fma4(b0, u, x1);
    u = v128.load(g, 16);
    a1 = fma4(a1, u, x0);
    b1 = fma4(b1, u, x1);
    u = v128.load(g, 32);
    a2 = fma4(a2, u, x0);
    b2 = fma4(b2, u, x1);
    u = v128.load(g, 48);
    a3 = fma4(a3, u, x0);
    b3 = fma4(b3, u, x1);
    if (c + 1 < groups) {
      x0 = v128.load(xp, 16);
      x1 = v128.load(xp + xs, 16);
      u = v128.load(g, 128);
      a0 = fma4(a0, u, x0);
      b0 = fma4(b0, u, x1);
      u = v128.load(g, 144);
      a1 = fma4(a1, u, x0);
      b1 = fma4(b1, u, x1);
      u = v128.load(g, 160);
      a2 = fma4(a2, u, x0);
      b2 = fma4(b2, u, x1);
      u = v128.load(g, 176);
      a3 = fma4(a3, u, x0);
      b3 = fma4(b3, u, x1);
    }
    g += 256;
    xp += 32;
  }
  const k = h << 2;
  const xb = xa + xs;
  store<f32>(ya, finish(F32, a0, tailOf(F32, sp, n, k), xa, n));
  store<f32>(ya, finish(F32, a1, tailOf(F32, sp, n, k + 1), xa, n), 4);
  store<f32>(ya, finish(F32, a2, tailOf(F32, sp, n, k + 2), xa, n), 8);
  store<f32>(ya, finish(F32, a3, tailOf(F32, sp, n, k + 3), xa, n), 12);
  store<f32>(yb, finish(F32, b0, tailOf(F32, sp, n, k), xb, n));
  store<f32>(yb, finish(F32, b1, tailOf(F32, sp, n, k + 1), xb, n), 4);
  store<f32>(yb, finish(F32, b2, tailOf(F32, sp, n, k + 2), xb, n), 8);
  store<f32>(yb, finish(F32, b3, tailOf(F32, sp, n, k + 3), xb, n), 12);
}

/**
 * The f32 strip at sp against every token row: for an odd count the first token by the whole strip
 * (which reads the strip front to back, as the prefetcher likes), then pairs of tokens by half
 * strips. An even count goes in pairs from the first (1.03-1.09x at 2, 8 and 64 rows: a pair does
 * twice the work per line it brings in). The strip (at most 32 n bytes) stays in cache while the
 * token rows stream past it.
 */
function stripRows(yo: usize, x: usize, sp: usize, rows: i32, n: i32, d: i32, acc: usize): void {
  const xs = <usize>n << 2;
  const ys = <usize>d << 2;
  let r = rows & 1;
  if (r != 0) strip8x1(F32, yo, x, sp, n, x, acc);
  for (; r + 2 <= rows; r += 2) {
    const xa = x + <usize>r * xs;
    const ya = yo + <usize>r * ys;
    half4x2(ya, ya + ys, xa, xs, sp, 0, n);
    half4x2(ya + 16, ya + ys + 16, xa, xs, sp, 1, n);
  }
}

/** One 16-bit group at g made f32 at o: its 8 rows' weights 0..3 at o, 4..7 at o + 128 (exact). */
@inline function dequantGroup(dt: i32, g: usize, o: usize): void {
  // Two rows an iteration: half the loop's overhead.
  for (let k: usize = 0; k < <usize>S; k += 2) {
    const v = v128.load(g + (k << 4));
    const v1 = v128.load(g + (k << 4), 16);
    v128.store(o + (k << 4), lo16(dt, v));
    v128.store(o + (k << 4), hi16(dt, v), 128);
    v128.store(o + (k << 4), lo16(dt, v1), 16);
    v128.store(o + (k << 4), hi16(dt, v1), 144);
  }
}

/**
 * The strip at sp, made f32 in the f32 strip layout at dst (exact). The groups go as four quarters
 * of the strip in step (group c of each in turn; the groups past 4 quarters after), so the strip
 * comes from memory as four streams: an Intel Xeon core's L2 prefetcher follows a stream only
 * within a 4 KiB page, and one stream waited at each new page (dispatch.ts' THE STREAMS, for
 * decode). The same bytes. 8 token rows of f16, one thread, bench/kernel-bounds.ts: from DRAM
 * 12.8 -> 15.7 GMAC/s (from L2 17.8 and 17.4); 1B F16's step of 8 sequences 403 -> 333 ms
 * (1.21x, Intel Xeon, two threads, bench/decode-ab.ts BATCH=8, three alternating rounds).
 */
@inline function dequantStrip(dt: i32, dst: usize, sp: usize, n: i32): void {
  const main = mainLen(dt, n);
  const groups = main / groupLen(dt);
  const quarter = groups >> 2;
  const qg = <usize>quarter * GROUP_BYTES;
  const qo = <usize>quarter * 256;
  for (let c = 0; c < quarter; c++) {
    const g = sp + <usize>c * GROUP_BYTES;
    const o = dst + <usize>c * 256;
    dequantGroup(dt, g, o);
    dequantGroup(dt, g + qg, o + qo);
    dequantGroup(dt, g + 2 * qg, o + 2 * qo);
    dequantGroup(dt, g + 3 * qg, o + 3 * qo);
  }
  for (let c = quarter << 2; c < groups; c++) dequantGroup(dt, sp + <usize>c * GROUP_BYTES, dst + <usize>c * 256);
  if (main == n) return;
  const o = dst + <usize>groups * 256;
  // The tails: weights main .. n4 go into one more f32 group, n4 .. n into the f32 tails.
  const n4 = n & ~3;
  for (let k = 0; k < S; k++) {
    const tp = tailOf(dt, sp, n, k);
    for (let j = main; j < n; j++) {
      const v = tail1(dt, tp, j - main);
      if (j < n4) store<f32>(o + (<usize>k << 4) + (<usize>(j - main) << 2), v);
      else store<f32>(tailOf(F32, dst, n, k) + (<usize>(j - n4) << 2), v);
    }
  }
}

/**
 * x[0 .. n) times k (2^112 or 2^102) into dst, when every |x| is below the f32 whose bits are
 * `below` (2^16 or 2^26: so exactly, the product finite); false (dst unspecified) otherwise. The test runs on the bits of |x|: as i32 they order as the values do, and a NaN's lie
 * above every finite one, so one integer max finds both (f32x4.max, NaN-propagating, is eight
 * instructions under JavaScriptCore and took 12% of a 1B F16 model's decode: matmul runs this
 * once per chunk of rows).
 */
@inline function scaleX(dst: usize, x: usize, n: i32, k1: f32, below: i32): bool {
  const k = f32x4.splat(k1);
  const absMask = i32x4.splat(0x7fffffff);
  let m = i32x4.splat(0);
  const n4 = n & ~3;
  for (let j = 0; j < n4; j += 4) {
    const v = v128.load(x + (<usize>j << 2));
    m = i32x4.max_s(m, v128.and(v, absMask));
    v128.store(dst + (<usize>j << 2), f32x4.mul(v, k));
  }
  let s = max(max(i32x4.extract_lane(m, 0), i32x4.extract_lane(m, 1)), max(i32x4.extract_lane(m, 2), i32x4.extract_lane(m, 3)));
  for (let j = n4; j < n; j++) {
    const v = load<f32>(x + (<usize>j << 2));
    s = max(s, <i32>(reinterpret<u32>(v) & 0x7fffffff));
    store<f32>(dst + (<usize>j << 2), v * k1);
  }
  return s < below;
}

/** scaleX for a 16-bit dt into dst: by 2^102 for shifted f16 (F16S), else by 2^112. */
@inline function scaleXFor(dt: i32, dst: usize, x: usize, n: i32): bool {
  return scaleX(dst, x, n, dt == F16S ? X102 : X112, dt == F16S ? BELOW26 : BELOW16);
}

/** Bytes scaleX's copy of n floats takes in scratch (16-aligned): a strip's running sums go after it. */
@inline function scaledXBytes(n: i32): usize {
  return ((<usize>n << 2) + 15) & ~15;
}

/**
 * Rows g0 .. g1 of the matrix at w (a thread's share: the split never changes an output) against
 * every token row; row g's outputs go to column g - r0 of y. Rows of a strip not wholly in the
 * range go one at a time. `scratch` (32 n + 128 bytes of this thread's own) holds a dequantized strip and a strip's sums.
 */
@inline function matmul(dt: i32, job: usize, g0: i32, g1: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const y = j.y;
  const x = j.x;
  const w = j.w;
  const rows = j.rows;
  const n = j.n;
  const d = j.d;
  const r0 = j.r0;
  const sb = stripBytes(dt, n);
  const xs = <usize>n << 2;
  const ys = <usize>d << 2;
  // One f16 token row runs on x scaled by 2^112 (shifted: 2^102) in scratch, unless some |x| >=
  // 2^16 (2^26) or is NaN.
  const half = dt == F16 || dt == F16S;
  // A strip's running sums (strip8x1) go past the scaled x, or past a dequantized strip.
  const stripF32Bytes = ((<usize>n << 5) + 15) & ~15;
  const scaled = half && rows == 1 && scaleXFor(dt, scratch, x, n);
  let g = g0;
  for (; g < g1 && ((g & (S - 1)) != 0 || g + S > g1); g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1x1(dt, x + <usize>r * xs, sp, g & (S - 1), n));
  }
  for (; g + S <= g1; g += S) {
    const sp = w + <usize>(g >> 3) * sb;
    const yo = y + (<usize>(g - r0) << 2);
    if (rows == 1) {
      const acc = scratch + scaledXBytes(n);
      if (dt == F16 && !scaled) strip8x1F16(yo, x, sp, n, acc);
      else if (dt == F16S && !scaled) strip8x1F16S(yo, x, sp, n, acc);
      else strip8x1(dt == F16 ? F16X : dt == F16S ? F16SX : dt, yo, x, sp, n, half ? scratch : x, acc);
    } else if (dt == F32) stripRows(yo, x, sp, rows, n, d, scratch);
    else {
      dequantStrip(dt, scratch, sp, n);
      stripRows(yo, x, scratch, rows, n, d, scratch + stripF32Bytes);
    }
  }
  for (; g < g1; g++) {
    const sp = w + <usize>(g >> 3) * sb;
    for (let r = 0; r < rows; r++) store<f32>(y + <usize>r * ys + (<usize>(g - r0) << 2), row1x1(dt, x + <usize>r * xs, sp, g & (S - 1), n));
  }
}

/**
 * THE SCALED X A THREAD KEEPS. streams scales an f16 job's x into the thread's scratch, and a
 * thread takes a dispatch's chunks one after another, most of them of the same x (its job's, and
 * q, k and v share one), and scaling it again for each cost a 1B F16 decode 2% (bench/decode-
 * ab.ts, Intel Xeon, 4 rounds: 101.4 against 99.4 ms a token kept). So the thread remembers which x
 * (address, length, coding) its scratch holds scaled, and whether that x scaled exactly, and
 * forgets it whenever the scratch may have been written otherwise: at the start of every
 * dispatch or whole job on the thread (x may have changed in place since), and before any other
 * kernel runs on that scratch (dispatch.ts' forgetScaledX calls). Globals are the thread's own
 * (each thread instantiates the module). Scaling x once for the dispatch, into memory both threads
 * read, ran 0.97x instead (decode-ab.s17-f16-x-scaled-once-1b.json).
 */
let keptX: usize = 0;
let keptN: i32 = 0;
let keptRows: i32 = 0;
let keptDt: i32 = -1;
let keptScratch: usize = 0;
let keptExact: bool = false;

/** Forgets the scaled x this thread keeps (see THE SCALED X A THREAD KEEPS). */
export function forgetScaledX(): void {
  keptDt = -1;
}

/**
 * scaleXFor of `rows` token rows (4 n bytes apart) into scratch (scaledXBytes(n) apart), or nothing
 * when the scratch already holds these rows scaled for dt: whether all scaled exactly.
 */
@inline function keptScaleX(dt: i32, scratch: usize, x: usize, n: i32, rows: i32 = 1): bool {
  if (keptDt == dt && keptX == x && keptN == n && keptRows == rows && keptScratch == scratch) return keptExact;
  let exact = true;
  for (let r = 0; r < rows; r++) exact = scaleXFor(dt, scratch + <usize>r * scaledXBytes(n), x + ((<usize>r * <usize>n) << 2), n) && exact;
  keptExact = exact;
  keptDt = dt;
  keptX = x;
  keptN = n;
  keptRows = rows;
  keptScratch = scratch;
  return keptExact;
}

/**
 * One token row in four streams far rows apart: whole strips g0 .. g1 and the three pieces after
 * them (all in the job), four strips in step (strips4), the sums in scratch past x (scaled for
 * f16: 4 n + 512 bytes of the 32 n, so n >= 32; kept between chunks, THE SCALED X A THREAD
 * KEEPS). An f16 x not scaled (some |x| >= 2^16), or an n below 32, takes the four pieces one
 * after another.
 */
@inline function streams(dt: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const x = j.x;
  if (j.rows > 1) {
    streamsRows(dt, job, g0, g1, far, scratch);
    return;
  }
  const half = dt == F16 || dt == F16S;
  if (n < 32 || (half && !keptScaleX(dt, scratch, x, n))) {
    piecesApart(dt, job, g0, g1, far, scratch);
    return;
  }
  const sb = stripBytes(dt, n);
  const acc = scratch + scaledXBytes(n);
  const xq = half ? scratch : x;
  const k = dt == F16 ? F16X : dt == F16S ? F16SX : dt;
  for (let g = g0; g < g1; g += S) strips4(k, j.y + (<usize>(g - j.r0) << 2), <usize>far << 2, x, j.w + <usize>(g >> 3) * sb, <usize>(far >> 3) * sb, n, xq, acc);
}

/**
 * Two or three token rows of a 16-bit matrix in four streams far rows apart, as one token's
 * (strips4): TURN groups of each strip in turn; per half strip, each group row widened once for
 * a pair of tokens (halfGroups2: 12 vector operations for 16 multiply-adds where one token takes 8
 * for 8), a third token by stripGroups while the groups are in L1; every running sum through acc
 * between turns, then each row's finish. Each sum strip8x1's, in its order: the same bits. f16 x
 * is scaled as for one token (F16X, kept between chunks: THE SCALED X A THREAD KEEPS); an x that
 * does not scale exactly, a scratch too small for the rows (n below 128), or f32 weights (which no
 * dispatch sends here), take the four pieces one after another. Strip by strip, a batch of 2 made
 * each strip f32 in scratch first (dequantStrip) and ran 1B F16 at 1.76x one token's time a step
 * (Intel Xeon, two threads); here 1.35x faster (bench/decode-ab.ts, decode-ab.s22-f16-rows-*.json).
 */
@inline function streamsRows(dt: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const n = j.n;
  const x = j.x;
  const rows = j.rows;
  const half = dt == F16 || dt == F16S;
  const xsb = scaledXBytes(n);
  if (dt == F32 || n < 128 || (half && !keptScaleX(dt, scratch, x, n, rows))) {
    piecesApart(dt, job, g0, g1, far, scratch);
    return;
  }
  const k = dt == F16 ? F16X : dt == F16S ? F16SX : dt;
  const gl = groupLen(k);
  const groups = mainLen(k, n) / gl;
  const sb = stripBytes(dt, n);
  const ss = <usize>(far >> 3) * sb;
  const ys = <usize>j.d << 2;
  const xq = half ? scratch : x;
  const xqs: usize = half ? xsb : <usize>n << 2;
  // Token r's sums for strip t at acc + (t * rows + r) * 128.
  const acc = scratch + (half ? <usize>rows * xsb : 0);
  const z = f32x4.splat(0);
  for (let g = g0; g < g1; g += S) {
    const sp = j.w + <usize>(g >> 3) * sb;
    const yo = j.y + (<usize>(g - j.r0) << 2);
    for (let i: usize = 0; i < <usize>rows << 9; i += 16) v128.store(acc + i, z);
    for (let c0 = 0; c0 < groups; c0 += TURN) {
      const c1 = min(c0 + TURN, groups);
      const xp = xq + (<usize>(c0 * gl) << 2);
      for (let t = 0; t < 4; t++) {
        const st = sp + <usize>t * ss;
        const at = acc + <usize>(t * rows) * 128;
        halfGroups2(k, at, st, 0, xp, xqs, c0, c1);
        halfGroups2(k, at, st, 1, xp, xqs, c0, c1);
        if (rows == 3) stripGroups(k, at + 256, st, xp + 2 * xqs, c0, c1);
      }
    }
    for (let t = 0; t < 4; t++) {
      for (let r = 0; r < rows; r++) {
        finishStrip(k, yo + <usize>t * (<usize>far << 2) + <usize>r * ys, acc + <usize>(t * rows + r) * 128, sp + <usize>t * ss, x + ((<usize>r * <usize>n) << 2), n);
      }
    }
  }
}

/**
 * Rows 4h .. 4h + 3 of the strip at sp, groups c0 .. c1, against two token rows from xp and xp +
 * xs (group c0's x); their running sums at acc (token 0's 8 rows, then token 1's at acc + 128),
 * strip8x1's additions in its order. Each group row is loaded and widened once for both tokens,
 * and each group's x once for its four rows (loaded per row, 1B F16 ran 2 sequences 1.03-1.06x
 * slower and 3 sequences 1.02x: bench/decode-ab.ts, Intel Xeon).
 */
@inline function halfGroups2(dt: i32, acc: usize, sp: usize, h: i32, xp: usize, xs: usize, c0: i32, c1: i32): void {
  const gl = groupLen(dt);
  const ho = <usize>h << 6;
  let a0 = v128.load(acc + ho), a1 = v128.load(acc + ho, 16), a2 = v128.load(acc + ho, 32), a3 = v128.load(acc + ho, 48);
  let b0 = v128.load(acc + 128 + ho), b1 = v128.load(acc + 128 + ho, 16), b2 = v128.load(acc + 128 + ho, 32), b3 = v128.load(acc + 128 + ho, 48);
  let g = sp + <usize>c0 * GROUP_BYTES + ho;
  for (let c = c0; c < c1; c++) {
    const xa0 = v128.load(xp);
    const xa1 = v128.load(xp, 16);
    const xb0 = v128.load(xp + xs);
    const xb1 = v128.load(xp + xs, 16);
    let v = v128.load(g);
    let lo = lo16(dt, v);
    let hi = hi16(dt, v);
    a0 = fma4(fma4(a0, lo, xa0), hi, xa1);
    b0 = fma4(fma4(b0, lo, xb0), hi, xb1);
    v = v128.load(g, 16);
    lo = lo16(dt, v);
    hi = hi16(dt, v);
    a1 = fma4(fma4(a1, lo, xa0), hi, xa1);
    b1 = fma4(fma4(b1, lo, xb0), hi, xb1);
    v = v128.load(g, 32);
    lo = lo16(dt, v);
    hi = hi16(dt, v);
    a2 = fma4(fma4(a2, lo, xa0), hi, xa1);
    b2 = fma4(fma4(b2, lo, xb0), hi, xb1);
    v = v128.load(g, 48);
    lo = lo16(dt, v);
    hi = hi16(dt, v);
    a3 = fma4(fma4(a3, lo, xa0), hi, xa1);
    b3 = fma4(fma4(b3, lo, xb0), hi, xb1);
    g += GROUP_BYTES;
    xp += <usize>gl << 2;
  }
  v128.store(acc + ho, a0);
  v128.store(acc + ho, a1, 16);
  v128.store(acc + ho, a2, 32);
  v128.store(acc + ho, a3, 48);
  v128.store(acc + 128 + ho, b0);
  v128.store(acc + 128 + ho, b1, 16);
  v128.store(acc + 128 + ho, b2, 32);
  v128.store(acc + 128 + ho, b3, 48);
}

/** The four pieces of a streams chunk one after another, by the exported kernel (streams' and streamsRows' fallback). */
@inline function piecesApart(dt: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  // The kernel writes the scratch (matmul.ts' THE SCALED X A THREAD KEEPS).
  forgetScaledX();
  for (let t = 0; t < 4; t++) matmulOf(dt, job, g0 + t * far, g1 + t * far, scratch);
}

/** The exported kernel of dt (called, not inlined again: streams' fallback). */
@inline function matmulOf(dt: i32, job: usize, g0: i32, g1: i32, scratch: usize): void {
  if (dt == F16) matmul_f16(job, g0, g1, scratch);
  else if (dt == F16S) matmul_f16s(job, g0, g1, scratch);
  else if (dt == BF16) matmul_bf16(job, g0, g1, scratch);
  else matmul_f32(job, g0, g1, scratch);
}

/** streams for the f32, f16 and bf16 kernels, fn their index. */
export function matmul_float_streams(fn: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  if (fn == F16) streams(F16, job, g0, g1, far, scratch);
  else if (fn == F16S) streams(F16S, job, g0, g1, far, scratch);
  else if (fn == BF16) streams(BF16, job, g0, g1, far, scratch);
  else streams(F32, job, g0, g1, far, scratch);
}

export function matmul_f32(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmul(F32, job, g0, g1, scratch);
}

export function matmul_f16(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmul(F16, job, g0, g1, scratch);
}

/** matmul_f16 on weights placed shifted (f16.ts' THE SHIFTED F16): the same outputs, bit for bit. */
export function matmul_f16s(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmul(F16S, job, g0, g1, scratch);
}

export function matmul_bf16(job: usize, g0: i32, g1: i32, scratch: usize): void {
  matmul(BF16, job, g0, g1, scratch);
}
