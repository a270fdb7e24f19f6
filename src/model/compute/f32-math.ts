/**
 * The kernels' elementwise f32 arithmetic (kernels/assembly/math.ts, elementwise.ts) written out
 * in plain JS: the same operations in the same order, each rounded to f32 with Math.fround, so
 * the same bits. The reference the kernels are tested against, and what the engine runs where
 * WebAssembly SIMD is missing.
 */

const f = Math.fround;
const bitsBuf = new Uint32Array(1);
const valBuf = new Float32Array(bitsBuf.buffer);
function fromBits(b: number): number {
  bitsBuf[0] = b;
  return valBuf[0]!;
}

const LOG2E = fromBits(0x3fb8aa3b);
const LN2_HI = fromBits(0x3f318000);
const LN2_LO = fromBits(0xb95e8083);
const C2 = fromBits(0x3f000000);
const C3 = fromBits(0x3e2aaaab);
const C4 = fromBits(0x3d2aaaab);
const C5 = fromBits(0x3c088889);
const C6 = fromBits(0x3ab60b61);

/** Rounds an integer-or-half value to the nearest integer, ties to even (f32x4.nearest). */
function nearestEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** e^x as math.ts's exp4 computes it (x an f32): inf above 88, 0 below -87, NaN stays NaN. */
export function expF32(x: number): number {
  if (x > 88) return Infinity;
  if (x < -87) return 0;
  const n = nearestEven(f(x * LOG2E));
  const r = f(f(x - f(n * LN2_HI)) - f(n * LN2_LO));
  let p = C6;
  p = f(f(p * r) + C5);
  p = f(f(p * r) + C4);
  p = f(f(p * r) + C3);
  p = f(f(p * r) + C2);
  p = f(f(p * r) + 1);
  p = f(f(p * r) + 1);
  // p * 2^n is exact in f64, so one rounding gives the f32 product.
  return f(p * 2 ** n);
}

/** h[i] = silu(h[i]) * g[i] = (h[i] / (1 + e^-h[i])) * g[i] for i < n, as elementwise.ts's swiglu. */
export function swigluF32(h: Float32Array, g: Float32Array, n: number): void {
  for (let i = 0; i < n; i++) {
    const a = h[i]!;
    h[i] = f(f(a / f(1 + expF32(-a))) * g[i]!);
  }
}

/**
 * a[o .. o+len) = softmax of itself as attention.ts's kernel computes it: the max, e^(x - max),
 * their sum as four lanes by index mod 4 folded (s0 + s1) + (s2 + s3) then the tail in order,
 * then each divided by the sum.
 */
export function softmaxF32(a: Float32Array, o: number, len: number): void {
  let max = -Infinity;
  for (let t = 0; t < len; t++) max = Math.max(max, a[o + t]!);
  const len4 = len - (len % 4);
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  for (let t = 0; t < len; t++) a[o + t] = expF32(f(a[o + t]! - max));
  for (let t = 0; t < len4; t += 4) {
    s0 = f(s0 + a[o + t]!);
    s1 = f(s1 + a[o + t + 1]!);
    s2 = f(s2 + a[o + t + 2]!);
    s3 = f(s3 + a[o + t + 3]!);
  }
  let sum = f(f(s0 + s1) + f(s2 + s3));
  for (let t = len4; t < len; t++) sum = f(sum + a[o + t]!);
  for (let t = 0; t < len; t++) a[o + t] = a[o + t]! / sum;
}
