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
  const rowBytes = <usize>dim << 2;
  const dim4 = dim & ~3;
  let r = 0;
  // Four rows at a time as two f64x2 chains of adds (rows r, r+1 in one, r+2, r+3 in the other):
  // each lane runs its row's chain, the same operations in the same order, and the chains'
  // latencies overlap; then two, then one.
  for (; r + 4 <= rows; r += 4) {
    const x0 = x + <usize>r * rowBytes;
    const x1 = x0 + rowBytes;
    const x2 = x1 + rowBytes;
    const x3 = x2 + rowBytes;
    let s01 = f64x2.splat(0);
    let s23 = s01;
    for (let i = 0; i < dim4; i += 4) {
      s01 = addSquares4(s01, x0, x1, i);
      s23 = addSquares4(s23, x2, x3, i);
    }
    for (let i = dim4; i < dim; i++) {
      s01 = addSquare1(s01, x0, x1, i);
      s23 = addSquare1(s23, x2, x3, i);
    }
    const o0 = o + <usize>r * rowBytes;
    scaleRows2(o0, x0, rowBytes, g, dim, invRms(s01, dim, f64x2.splat(eps)));
    scaleRows2(o0 + 2 * rowBytes, x2, rowBytes, g, dim, invRms(s23, dim, f64x2.splat(eps)));
  }
  for (; r + 2 <= rows; r += 2) {
    const at = <usize>r * rowBytes;
    scaleRows2(o + at, x + at, rowBytes, g, dim, invRms(sumSquares2(x + at, rowBytes, dim), dim, f64x2.splat(eps)));
  }
  if (r < rows) {
    // The last row alone, in scalar f64.
    const at = <usize>r * rowBytes;
    let ss: f64 = 0;
    for (let i = 0; i < dim; i++) {
      const v = <f64>load<f32>(x + at + (<usize>i << 2));
      ss += v * v;
    }
    const inv = 1 / Math.sqrt(ss / <f64>dim + eps);
    for (let i = 0; i < dim; i++) {
      const a = <usize>i << 2;
      store<f32>(o + at + a, <f32>(<f64>load<f32>(g + a) * (inv * <f64>load<f32>(x + at + a))));
    }
  }
}

/** Lanes 0 and 1 of a and b (i32 lanes) as (a[k], b[k]) in f64, k = 0..3: one row's element in each f64 lane. */
@inline function pairLo(a: v128, b: v128, k: i32): v128 {
  // k is a constant at every call once inlined; the shuffle's lanes must be immediates.
  if (k == 0) return f64x2.promote_low_f32x4(i32x4.shuffle(a, b, 0, 4, 0, 4));
  if (k == 1) return f64x2.promote_low_f32x4(i32x4.shuffle(a, b, 1, 5, 1, 5));
  if (k == 2) return f64x2.promote_low_f32x4(i32x4.shuffle(a, b, 2, 6, 2, 6));
  return f64x2.promote_low_f32x4(i32x4.shuffle(a, b, 3, 7, 3, 7));
}

/** ss + x[i]^2 in f64 for the rows at a and b, elements i .. i+3 in order (one row per lane). */
@inline function addSquares4(ss: v128, a: usize, b: usize, i: i32): v128 {
  const va = v128.load(a + (<usize>i << 2));
  const vb = v128.load(b + (<usize>i << 2));
  let v = pairLo(va, vb, 0);
  ss = f64x2.add(ss, f64x2.mul(v, v));
  v = pairLo(va, vb, 1);
  ss = f64x2.add(ss, f64x2.mul(v, v));
  v = pairLo(va, vb, 2);
  ss = f64x2.add(ss, f64x2.mul(v, v));
  v = pairLo(va, vb, 3);
  return f64x2.add(ss, f64x2.mul(v, v));
}

/** ss + x[i]^2 in f64 for element i of the rows at a and b (the tail past dim & ~3). */
@inline function addSquare1(ss: v128, a: usize, b: usize, i: i32): v128 {
  const v = f64x2(<f64>load<f32>(a + (<usize>i << 2)), <f64>load<f32>(b + (<usize>i << 2)));
  return f64x2.add(ss, f64x2.mul(v, v));
}

/** The sums of squares of the two rows at x and x + rowBytes, lane 0 and lane 1, each in i order from +0. */
@inline function sumSquares2(x: usize, rowBytes: usize, dim: i32): v128 {
  const dim4 = dim & ~3;
  const xb = x + rowBytes;
  let ss = f64x2.splat(0);
  for (let i = 0; i < dim4; i += 4) ss = addSquares4(ss, x, xb, i);
  for (let i = dim4; i < dim; i++) ss = addSquare1(ss, x, xb, i);
  return ss;
}

/** 1 / sqrt(ss / dim + eps) lane by lane (f64x2, rounded as the scalar operations are). */
@inline function invRms(ss: v128, dim: i32, eps: v128): v128 {
  return f64x2.div(f64x2.splat(1), f64x2.sqrt(f64x2.add(f64x2.div(ss, f64x2.splat(<f64>dim)), eps)));
}

/** f32(g[i] * (inv * x[i])) in f64 for elements i .. i+3 of one row (inv splat), as f32x4. */
@inline function scaled4(xv: v128, glo: v128, ghi: v128, inv: v128): v128 {
  const lo = f64x2.mul(glo, f64x2.mul(inv, f64x2.promote_low_f32x4(xv)));
  const hi = f64x2.mul(ghi, f64x2.mul(inv, f64x2.promote_low_f32x4(i32x4.shuffle(xv, xv, 2, 3, 2, 3))));
  return i32x4.shuffle(f32x4.demote_f64x2_zero(lo), f32x4.demote_f64x2_zero(hi), 0, 1, 4, 5);
}

/** o = g * (inv * x) for the two rows at x and x + rowBytes, inv's lane 0 the first row's, lane 1 the second's. */
@inline function scaleRows2(o: usize, x: usize, rowBytes: usize, g: usize, dim: i32, inv: v128): void {
  const dim4 = dim & ~3;
  const inv0 = f64x2.splat(f64x2.extract_lane(inv, 0));
  const inv1 = f64x2.splat(f64x2.extract_lane(inv, 1));
  const x1 = x + rowBytes;
  const o1 = o + rowBytes;
  for (let i = 0; i < dim4; i += 4) {
    const a = <usize>i << 2;
    const gv = v128.load(g + a);
    const glo = f64x2.promote_low_f32x4(gv);
    const ghi = f64x2.promote_low_f32x4(i32x4.shuffle(gv, gv, 2, 3, 2, 3));
    v128.store(o + a, scaled4(v128.load(x + a), glo, ghi, inv0));
    v128.store(o1 + a, scaled4(v128.load(x1 + a), glo, ghi, inv1));
  }
  for (let i = dim4; i < dim; i++) {
    const a = <usize>i << 2;
    const gi = <f64>load<f32>(g + a);
    store<f32>(o + a, <f32>(gi * (f64x2.extract_lane(inv0, 0) * <f64>load<f32>(x + a))));
    store<f32>(o1 + a, <f32>(gi * (f64x2.extract_lane(inv1, 0) * <f64>load<f32>(x1 + a))));
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

/**
 * ropeRow for heads of hd % 4 == 0, two pairs at a time: pairs i and i + 2 turn by the angles at
 * t and t + 1 (adjacent in the tables), a in one f64x2, b in another, each lane the scalar's
 * operations (a c - b s and a s + b c, each rounded to f64, then to f32).
 */
@inline function ropeRow4(p: usize, n: i32, hd: i32, base: i32, cos: usize, sin: usize): void {
  for (let h = 0; h < n; h += hd) {
    const row = p + (<usize>h << 2);
    for (let i = 0; i < hd; i += 4) {
      const t = <usize>(base + (i >> 1)) << 3;
      const c = v128.load(cos + t);
      const s = v128.load(sin + t);
      const at = row + (<usize>i << 2);
      const v = v128.load(at);
      const a = f64x2.promote_low_f32x4(i32x4.shuffle(v, v, 0, 2, 0, 2));
      const b = f64x2.promote_low_f32x4(i32x4.shuffle(v, v, 1, 3, 1, 3));
      const x = f32x4.demote_f64x2_zero(f64x2.sub(f64x2.mul(a, c), f64x2.mul(b, s)));
      const y = f32x4.demote_f64x2_zero(f64x2.add(f64x2.mul(a, s), f64x2.mul(b, c)));
      v128.store(at, i32x4.shuffle(x, y, 0, 4, 1, 5));
    }
  }
}

/** RoPE of every row's q (qDim) and k (kvDim), row r at position pos[r] (i32), tables of hd / 2 angles per position. */
export function rope(q: usize, k: usize, pos: usize, cos: usize, sin: usize, rows: i32, qDim: i32, kvDim: i32, hd: i32): void {
  for (let r = 0; r < rows; r++) {
    const base = load<i32>(pos + (<usize>r << 2)) * (hd >> 1);
    const qr = q + (<usize>(r * qDim) << 2);
    const kr = k + (<usize>(r * kvDim) << 2);
    if ((hd & 3) == 0) {
      ropeRow4(qr, qDim, hd, base, cos, sin);
      ropeRow4(kr, kvDim, hd, base, cos, sin);
    } else {
      ropeRow(qr, qDim, hd, base, cos, sin);
      ropeRow(kr, kvDim, hd, base, cos, sin);
    }
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
  const n8 = n & ~7;
  const n4 = n & ~3;
  // Eight at a time (one narrowing and one store for two roundings), then four.
  for (let i = 0; i < n8; i += 8) {
    const lo = f16Bits4(v128.load(src + (<usize>i << 2)));
    const hi = f16Bits4(v128.load(src + (<usize>i << 2), 16));
    v128.store(dst + (<usize>i << 1), i16x8.narrow_i32x4_u(lo, hi));
  }
  for (let i = n8; i < n4; i += 4) {
    const h = f16Bits4(v128.load(src + (<usize>i << 2)));
    v128.store64_lane(dst + (<usize>i << 1), i16x8.narrow_i32x4_u(h, h), 0);
  }
  for (let i = n4; i < n; i++) {
    store<u16>(dst + (<usize>i << 1), <u16>i32x4.extract_lane(f16Bits4(i32x4.splat(load<i32>(src + (<usize>i << 2)))), 0));
  }
}
