// Matrix-vector kernels of the transformer, in AssemblyScript (built by scripts/build-kernels.mjs
// into ../matmul.wasm; `npm test` fails when that file is not what this source builds).
//
//   y[r*d + i] = dot(W row i, x row r)   for r < rows, i0 <= i < i1
//
// W is (d, n) row-major in one of four dtypes; x and y are f32. Every argument that names memory
// is a byte offset into the one imported memory.
//
// THE ORDER. Every output, whatever its dtype, tile, batch or thread, is summed the same way:
// each weight is first made an f32 exactly (f16, bf16 and int8 * f16-scale all fit in f32), then
// four f32 lanes sum j = l (mod 4) for j < n - n % 4, each `s + w * x` rounded after the product
// and after the sum (WebAssembly never fuses them), then (s0 + s1) + (s2 + s3), then the n % 4
// tail one by one. So a 16-bit or q8_0 matrix gives the bits that the f32 kernel gives on its
// dequantized copy, and matmulRef in matmul.ts states the order in plain JS.
//
// Tiles only decide which outputs share the loads: one token row takes 8 weight rows at a time
// (eight independent sums in flight); more rows take 4 weight rows by 2 tokens, then the odd token.

import { f16ToF32, f16x4, top16x4 } from "./f16";

const F32: i32 = 0;
const F16: i32 = 1;
const BF16: i32 = 2;
const Q8_0: i32 = 3;

/** q8_0 (ggml): blocks of 32 weights, an f16 scale then 32 int8, 34 bytes. */
const QK: i32 = 32;
const Q8_BYTES: i32 = 34;

/** Bytes of one weight row of n elements. */
@inline function rowBytes(dt: i32, n: i32): usize {
  if (dt == F32) return <usize>n << 2;
  if (dt == Q8_0) return <usize>(n / QK) * Q8_BYTES;
  return <usize>n << 1;
}

/** Weights per chunk of the inner loop: a q8_0 block shares one scale; other dtypes go by 4. */
@inline function chunkLen(dt: i32): i32 {
  return dt == Q8_0 ? QK : 4;
}

@inline function chunkBytes(dt: i32): usize {
  if (dt == F32) return 16;
  if (dt == Q8_0) return Q8_BYTES;
  return 8;
}

/** The splatted scale of the q8_0 block at p; unused (folded away) for other dtypes. */
@inline function chunkScale(dt: i32, p: usize): v128 {
  if (dt == Q8_0) return f32x4.splat(f16ToF32(<u32>load<u16>(p)));
  return f32x4.splat(0);
}

/** Weights g*4 .. g*4+3 of the chunk at p, as f32x4. */
@inline function w4(dt: i32, p: usize, g: i32, scale: v128): v128 {
  if (dt == F32) return v128.load(p);
  if (dt == F16) return f16x4(top16x4(p));
  if (dt == BF16) return top16x4(p);
  const q = i32x4.extend_low_i16x8_s(i16x8.extend_low_i8x16_s(v128.load32_zero(p + 2 + (<usize>g << 2))));
  return f32x4.mul(f32x4.convert_i32x4_s(q), scale);
}

/** Weight j of a row at p, as f32 (the n % 4 tail; q8_0 rows have none). */
@inline function w1(dt: i32, p: usize, j: i32): f32 {
  if (dt == F32) return load<f32>(p + (<usize>j << 2));
  if (dt == F16) return f16ToF32(<u32>load<u16>(p + (<usize>j << 1)));
  return reinterpret<f32>(<u32>load<u16>(p + (<usize>j << 1)) << 16);
}

/** The fold and the tail: (s0 + s1) + (s2 + s3), then w[j] * x[j] for n4 <= j < n in order. */
@inline function finish(dt: i32, acc: v128, wRow: usize, xRow: usize, n4: i32, n: i32): f32 {
  let s = (f32x4.extract_lane(acc, 0) + f32x4.extract_lane(acc, 1)) + (f32x4.extract_lane(acc, 2) + f32x4.extract_lane(acc, 3));
  for (let j = n4; j < n; j++) s += w1(dt, wRow, j) * load<f32>(xRow + (<usize>j << 2));
  return s;
}

@inline function fma4(acc: v128, w: v128, x: v128): v128 {
  return f32x4.add(acc, f32x4.mul(w, x));
}

/** Weight rows i .. i+7 against token row r. */
@inline function strip8x1(dt: i32, y: usize, x: usize, w: usize, n: i32, d: i32, i: i32, r: i32): void {
  const rb = rowBytes(dt, n);
  const cl = chunkLen(dt);
  const cb = chunkBytes(dt);
  const nChunks = (n & ~3) / cl;
  const w0 = w + <usize>i * rb;
  const xr = x + ((<usize>r * <usize>n) << 2);
  let a0 = f32x4.splat(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  let p = w0;
  let xp = xr;
  for (let c = 0; c < nChunks; c++) {
    const s0 = chunkScale(dt, p), s1 = chunkScale(dt, p + rb), s2 = chunkScale(dt, p + 2 * rb), s3 = chunkScale(dt, p + 3 * rb);
    const s4 = chunkScale(dt, p + 4 * rb), s5 = chunkScale(dt, p + 5 * rb), s6 = chunkScale(dt, p + 6 * rb), s7 = chunkScale(dt, p + 7 * rb);
    for (let g = 0; g < cl; g += 4) {
      const xv = v128.load(xp);
      a0 = fma4(a0, w4(dt, p, g >> 2, s0), xv);
      a1 = fma4(a1, w4(dt, p + rb, g >> 2, s1), xv);
      a2 = fma4(a2, w4(dt, p + 2 * rb, g >> 2, s2), xv);
      a3 = fma4(a3, w4(dt, p + 3 * rb, g >> 2, s3), xv);
      a4 = fma4(a4, w4(dt, p + 4 * rb, g >> 2, s4), xv);
      a5 = fma4(a5, w4(dt, p + 5 * rb, g >> 2, s5), xv);
      a6 = fma4(a6, w4(dt, p + 6 * rb, g >> 2, s6), xv);
      a7 = fma4(a7, w4(dt, p + 7 * rb, g >> 2, s7), xv);
      xp += 16;
    }
    p += cb;
  }
  const n4 = n & ~3;
  const yo = y + ((<usize>r * <usize>d + <usize>i) << 2);
  store<f32>(yo, finish(dt, a0, w0, xr, n4, n));
  store<f32>(yo + 4, finish(dt, a1, w0 + rb, xr, n4, n));
  store<f32>(yo + 8, finish(dt, a2, w0 + 2 * rb, xr, n4, n));
  store<f32>(yo + 12, finish(dt, a3, w0 + 3 * rb, xr, n4, n));
  store<f32>(yo + 16, finish(dt, a4, w0 + 4 * rb, xr, n4, n));
  store<f32>(yo + 20, finish(dt, a5, w0 + 5 * rb, xr, n4, n));
  store<f32>(yo + 24, finish(dt, a6, w0 + 6 * rb, xr, n4, n));
  store<f32>(yo + 28, finish(dt, a7, w0 + 7 * rb, xr, n4, n));
}

/** Weight rows i .. i+3 against token rows r and r+1: each weight load serves two tokens. */
@inline function strip4x2(dt: i32, y: usize, x: usize, w: usize, n: i32, d: i32, i: i32, r: i32): void {
  const rb = rowBytes(dt, n);
  const cl = chunkLen(dt);
  const cb = chunkBytes(dt);
  const nChunks = (n & ~3) / cl;
  const w0 = w + <usize>i * rb;
  const xr = x + ((<usize>r * <usize>n) << 2);
  const xs = <usize>n << 2;
  let a0 = f32x4.splat(0), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  let p = w0;
  let xp = xr;
  for (let c = 0; c < nChunks; c++) {
    const s0 = chunkScale(dt, p), s1 = chunkScale(dt, p + rb), s2 = chunkScale(dt, p + 2 * rb), s3 = chunkScale(dt, p + 3 * rb);
    for (let g = 0; g < cl; g += 4) {
      const xa = v128.load(xp);
      const xb = v128.load(xp + xs);
      let u = w4(dt, p, g >> 2, s0);
      a0 = fma4(a0, u, xa);
      b0 = fma4(b0, u, xb);
      u = w4(dt, p + rb, g >> 2, s1);
      a1 = fma4(a1, u, xa);
      b1 = fma4(b1, u, xb);
      u = w4(dt, p + 2 * rb, g >> 2, s2);
      a2 = fma4(a2, u, xa);
      b2 = fma4(b2, u, xb);
      u = w4(dt, p + 3 * rb, g >> 2, s3);
      a3 = fma4(a3, u, xa);
      b3 = fma4(b3, u, xb);
      xp += 16;
    }
    p += cb;
  }
  const n4 = n & ~3;
  const ya = y + ((<usize>r * <usize>d + <usize>i) << 2);
  const yb = ya + (<usize>d << 2);
  const xr2 = xr + xs;
  store<f32>(ya, finish(dt, a0, w0, xr, n4, n));
  store<f32>(ya + 4, finish(dt, a1, w0 + rb, xr, n4, n));
  store<f32>(ya + 8, finish(dt, a2, w0 + 2 * rb, xr, n4, n));
  store<f32>(ya + 12, finish(dt, a3, w0 + 3 * rb, xr, n4, n));
  store<f32>(yb, finish(dt, b0, w0, xr2, n4, n));
  store<f32>(yb + 4, finish(dt, b1, w0 + rb, xr2, n4, n));
  store<f32>(yb + 8, finish(dt, b2, w0 + 2 * rb, xr2, n4, n));
  store<f32>(yb + 12, finish(dt, b3, w0 + 3 * rb, xr2, n4, n));
}

/** Weight rows i .. i+3 against token row r: the odd token of a batch, and f16 at batch 1. */
@inline function strip4x1(dt: i32, y: usize, x: usize, w: usize, n: i32, d: i32, i: i32, r: i32): void {
  const rb = rowBytes(dt, n);
  const cl = chunkLen(dt);
  const cb = chunkBytes(dt);
  const nChunks = (n & ~3) / cl;
  const w0 = w + <usize>i * rb;
  const xr = x + ((<usize>r * <usize>n) << 2);
  let a0 = f32x4.splat(0), a1 = a0, a2 = a0, a3 = a0;
  let p = w0;
  let xp = xr;
  for (let c = 0; c < nChunks; c++) {
    const s0 = chunkScale(dt, p), s1 = chunkScale(dt, p + rb), s2 = chunkScale(dt, p + 2 * rb), s3 = chunkScale(dt, p + 3 * rb);
    for (let g = 0; g < cl; g += 4) {
      const xv = v128.load(xp);
      a0 = fma4(a0, w4(dt, p, g >> 2, s0), xv);
      a1 = fma4(a1, w4(dt, p + rb, g >> 2, s1), xv);
      a2 = fma4(a2, w4(dt, p + 2 * rb, g >> 2, s2), xv);
      a3 = fma4(a3, w4(dt, p + 3 * rb, g >> 2, s3), xv);
      xp += 16;
    }
    p += cb;
  }
  const n4 = n & ~3;
  const yo = y + ((<usize>r * <usize>d + <usize>i) << 2);
  store<f32>(yo, finish(dt, a0, w0, xr, n4, n));
  store<f32>(yo + 4, finish(dt, a1, w0 + rb, xr, n4, n));
  store<f32>(yo + 8, finish(dt, a2, w0 + 2 * rb, xr, n4, n));
  store<f32>(yo + 12, finish(dt, a3, w0 + 3 * rb, xr, n4, n));
}

/** One weight row against one token row: the leftovers. */
@inline function strip1x1(dt: i32, y: usize, x: usize, w: usize, n: i32, d: i32, i: i32, r: i32): void {
  const rb = rowBytes(dt, n);
  const cl = chunkLen(dt);
  const cb = chunkBytes(dt);
  const nChunks = (n & ~3) / cl;
  const w0 = w + <usize>i * rb;
  const xr = x + ((<usize>r * <usize>n) << 2);
  let a0 = f32x4.splat(0);
  let p = w0;
  let xp = xr;
  for (let c = 0; c < nChunks; c++) {
    const s0 = chunkScale(dt, p);
    for (let g = 0; g < cl; g += 4) {
      a0 = fma4(a0, w4(dt, p, g >> 2, s0), v128.load(xp));
      xp += 16;
    }
    p += cb;
  }
  store<f32>(y + ((<usize>r * <usize>d + <usize>i) << 2), finish(dt, a0, w0, xr, n & ~3, n));
}

/**
 * Output rows i0 .. i1 of every token row (a thread's share: the split never changes an output).
 * Weight strips outside, token rows inside, so a strip stays in cache across a prefill's rows.
 */
@inline function matmul(dt: i32, y: usize, x: usize, w: usize, rows: i32, n: i32, d: i32, i0: i32, i1: i32): void {
  let i = i0;
  if (rows == 1) {
    for (; i + 8 <= i1; i += 8) strip8x1(dt, y, x, w, n, d, i, 0);
  } else {
    for (; i + 4 <= i1; i += 4) {
      let r = 0;
      for (; r + 2 <= rows; r += 2) strip4x2(dt, y, x, w, n, d, i, r);
      if (r < rows) strip4x1(dt, y, x, w, n, d, i, r);
    }
  }
  for (; i < i1; i++) {
    for (let r = 0; r < rows; r++) strip1x1(dt, y, x, w, n, d, i, r);
  }
}

export function matmul_f32(y: usize, x: usize, w: usize, rows: i32, n: i32, d: i32, i0: i32, i1: i32): void {
  matmul(F32, y, x, w, rows, n, d, i0, i1);
}

export function matmul_f16(y: usize, x: usize, w: usize, rows: i32, n: i32, d: i32, i0: i32, i1: i32): void {
  matmul(F16, y, x, w, rows, n, d, i0, i1);
}

export function matmul_bf16(y: usize, x: usize, w: usize, rows: i32, n: i32, d: i32, i0: i32, i1: i32): void {
  matmul(BF16, y, x, w, rows, n, d, i0, i1);
}

/** n must be a multiple of 32 (the caller checks). */
export function matmul_q8_0(y: usize, x: usize, w: usize, rows: i32, n: i32, d: i32, i0: i32, i1: i32): void {
  matmul(Q8_0, y, x, w, rows, n, d, i0, i1);
}
