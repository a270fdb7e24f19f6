// The transformer's elementwise kernels in AssemblyScript: SwiGLU, the residual add and the
// f32 -> f16 rounding of K/V for the cache (built with matmul.ts into one module).
//
// THE ORDER. Every result is a fixed sequence of f32 operations, each rounded (WebAssembly never
// fuses), lane by lane, so src/model/f32-math.ts writes the same steps out in plain JS with
// Math.fround and gets the same bits; tests hold the two together.

import { exp4, f16Bits4 } from "./math";

/** silu(a) * b = (a / (1 + e^-a)) * b lane by lane. */
@inline function swiglu4(a: v128, b: v128): v128 {
  const e = exp4(f32x4.neg(a));
  return f32x4.mul(f32x4.div(a, f32x4.add(f32x4.splat(1), e)), b);
}

/** h[i] = silu(h[i]) * g[i] for i < n (f32 arrays at h and g). */
export function swiglu(h: usize, g: usize, n: i32): void {
  const n4 = n & ~3;
  for (let i = 0; i < n4; i += 4) {
    const a = h + (<usize>i << 2);
    v128.store(a, swiglu4(v128.load(a), v128.load(g + (<usize>i << 2))));
  }
  for (let i = n4; i < n; i++) {
    const a = h + (<usize>i << 2);
    store<f32>(a, f32x4.extract_lane(swiglu4(f32x4.splat(load<f32>(a)), f32x4.splat(load<f32>(g + (<usize>i << 2)))), 0));
  }
}

/**
 * o[r] = g * (inv * x[r]), inv = 1 / sqrt(sum of x[r][i]^2 / dim + eps), for rows of dim f32: in
 * f64, every product and sum rounded to f64 in i order and the result once to f32, as JS's
 * rmsnorm in transformer.ts computes it (so both give the same bits).
 */
export function rmsnorm(o: usize, x: usize, g: usize, rows: i32, dim: i32, eps: f64): void {
  let r = 0;
  // Two rows at a time in the two f64 lanes: each lane runs its row's chain of adds, the same
  // operations in the same order, and the two chains' latencies overlap.
  for (; r + 2 <= rows; r += 2) rmsnorm2(o + (<usize>(r * dim) << 2), x + (<usize>(r * dim) << 2), g, dim, eps);
  for (; r < rows; r++) {
    const xr = x + (<usize>(r * dim) << 2);
    const orow = o + (<usize>(r * dim) << 2);
    let ss: f64 = 0;
    for (let i = 0; i < dim; i++) {
      const v = <f64>load<f32>(xr + (<usize>i << 2));
      ss += v * v;
    }
    const inv = 1 / Math.sqrt(ss / <f64>dim + eps);
    for (let i = 0; i < dim; i++) {
      store<f32>(orow + (<usize>i << 2), <f32>(<f64>load<f32>(g + (<usize>i << 2)) * (inv * <f64>load<f32>(xr + (<usize>i << 2)))));
    }
  }
}

/** rmsnorm of the two rows at x and x + dim floats into o (lane 0 the first row, lane 1 the second). */
@inline function rmsnorm2(o: usize, x: usize, g: usize, dim: i32, eps: f64): void {
  const xb = x + (<usize>dim << 2);
  let ss = f64x2.splat(0);
  for (let i = 0; i < dim; i++) {
    const at = <usize>i << 2;
    const v = f64x2(<f64>load<f32>(x + at), <f64>load<f32>(xb + at));
    ss = f64x2.add(ss, f64x2.mul(v, v));
  }
  const inv = f64x2.div(f64x2.splat(1), f64x2.sqrt(f64x2.add(f64x2.div(ss, f64x2.splat(<f64>dim)), f64x2.splat(eps))));
  const ob = o + (<usize>dim << 2);
  for (let i = 0; i < dim; i++) {
    const at = <usize>i << 2;
    const v = f64x2(<f64>load<f32>(x + at), <f64>load<f32>(xb + at));
    const y = f64x2.mul(f64x2.splat(<f64>load<f32>(g + at)), f64x2.mul(inv, v));
    store<f32>(o + at, <f32>f64x2.extract_lane(y, 0));
    store<f32>(ob + at, <f32>f64x2.extract_lane(y, 1));
  }
}

/**
 * RoPE of one row of n f32 at p (heads of hd): pair (i, i + 1) turns by the angle at t = base +
 * (i mod hd) / 2 of the f64 tables cos and sin, in f64 as JS's rope in transformer.ts (a c - b s,
 * a s + b c, each rounded to f64, then to f32).
 */
@inline function ropeRow(p: usize, n: i32, hd: i32, base: i32, cos: usize, sin: usize): void {
  for (let i = 0; i < n; i += 2) {
    const t = <usize>(base + ((i % hd) >> 1)) << 3;
    const c = load<f64>(cos + t);
    const s = load<f64>(sin + t);
    const a = <f64>load<f32>(p + (<usize>i << 2));
    const b = <f64>load<f32>(p + (<usize>i << 2), 4);
    store<f32>(p + (<usize>i << 2), <f32>(a * c - b * s));
    store<f32>(p + (<usize>i << 2), <f32>(a * s + b * c), 4);
  }
}

/** RoPE of every row's q (qDim) and k (kvDim), row r at position pos[r] (i32), tables of hd / 2 angles per position. */
export function rope(q: usize, k: usize, pos: usize, cos: usize, sin: usize, rows: i32, qDim: i32, kvDim: i32, hd: i32): void {
  for (let r = 0; r < rows; r++) {
    const base = load<i32>(pos + (<usize>r << 2)) * (hd >> 1);
    ropeRow(q + (<usize>(r * qDim) << 2), qDim, hd, base, cos, sin);
    ropeRow(k + (<usize>(r * kvDim) << 2), kvDim, hd, base, cos, sin);
  }
}

/** x[i] += y[i] for i < n: one f32 add each, as JS's x[i] += y[i] on Float32Arrays gives. */
export function add_into(x: usize, y: usize, n: i32): void {
  const n4 = n & ~3;
  for (let i = 0; i < n4; i += 4) {
    const a = x + (<usize>i << 2);
    v128.store(a, f32x4.add(v128.load(a), v128.load(y + (<usize>i << 2))));
  }
  for (let i = n4; i < n; i++) {
    const a = x + (<usize>i << 2);
    store<f32>(a, load<f32>(a) + load<f32>(y + (<usize>i << 2)));
  }
}

/**
 * Each row r's K and V (kvDim f32 each, rows back to back at k and v) as f16 (to_f16) into the KV
 * cache in place: K at the byte address dst[r] (an i32) plus layerOff, V vOff bytes past it.
 */
export function store_kv(dst: usize, layerOff: usize, vOff: usize, k: usize, v: usize, rows: i32, kvDim: i32): void {
  for (let r = 0; r < rows; r++) {
    const at = <usize>load<i32>(dst + (<usize>r << 2)) + layerOff;
    const src = <usize>(r * kvDim) << 2;
    to_f16(at, k + src, kvDim);
    to_f16(at + vOff, v + src, kvDim);
  }
}

/** n f32 at src to f16 at dst (see f16Bits4). */
export function to_f16(dst: usize, src: usize, n: i32): void {
  const n4 = n & ~3;
  for (let i = 0; i < n4; i += 4) {
    const h = f16Bits4(v128.load(src + (<usize>i << 2)));
    v128.store64_lane(dst + (<usize>i << 1), i16x8.narrow_i32x4_u(h, h), 0);
  }
  for (let i = n4; i < n; i++) {
    store<u16>(dst + (<usize>i << 1), <u16>i32x4.extract_lane(f16Bits4(i32x4.splat(load<i32>(src + (<usize>i << 2)))), 0));
  }
}
