/**
 * y[r*d + i] = sum_{j<n} w[wOff + i*n + j] * x[r*n + j]  for r < rows, i < d.
 *
 * Batch invariance rests on one rule: every output is a single f64 accumulator summed over
 * j = 0, 1, ..., n-1 in order, then rounded once to f32 on store. The register tiles (4 weight
 * rows x 4, 2 or 1 token rows; 8 x 1 for a single row) only change which outputs are computed
 * side by side, never the order inside one, so a row's result is the same bits whatever else
 * shares the call.
 * JS forbids fused multiply-add, so `a += u * p` is the same two roundings on every engine.
 */
export function matmul(
  y: Float32Array,
  x: Float32Array,
  w: Float32Array,
  wOff: number,
  rows: number,
  n: number,
  d: number,
): void {
  if (rows === 1) {
    gemv(y, x, w, wOff, n, d);
    return;
  }
  let i = 0;
  for (; i + 4 <= d; i += 4) {
    const w0 = wOff + i * n;
    const w1 = w0 + n;
    const w2 = w1 + n;
    const w3 = w2 + n;
    let r = 0;
    for (; r + 4 <= rows; r += 4) {
      const xa = r * n;
      const xb = xa + n;
      const xc = xb + n;
      const xd = xc + n;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      let b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      let c0 = 0, c1 = 0, c2 = 0, c3 = 0;
      let d0 = 0, d1 = 0, d2 = 0, d3 = 0;
      for (let j = 0; j < n; j++) {
        const u0 = w[w0 + j]!, u1 = w[w1 + j]!, u2 = w[w2 + j]!, u3 = w[w3 + j]!;
        let p = x[xa + j]!;
        a0 += u0 * p; a1 += u1 * p; a2 += u2 * p; a3 += u3 * p;
        p = x[xb + j]!;
        b0 += u0 * p; b1 += u1 * p; b2 += u2 * p; b3 += u3 * p;
        p = x[xc + j]!;
        c0 += u0 * p; c1 += u1 * p; c2 += u2 * p; c3 += u3 * p;
        p = x[xd + j]!;
        d0 += u0 * p; d1 += u1 * p; d2 += u2 * p; d3 += u3 * p;
      }
      let o = r * d + i;
      y[o] = a0; y[o + 1] = a1; y[o + 2] = a2; y[o + 3] = a3;
      o += d;
      y[o] = b0; y[o + 1] = b1; y[o + 2] = b2; y[o + 3] = b3;
      o += d;
      y[o] = c0; y[o + 1] = c1; y[o + 2] = c2; y[o + 3] = c3;
      o += d;
      y[o] = d0; y[o + 1] = d1; y[o + 2] = d2; y[o + 3] = d3;
    }
    if (r + 2 <= rows) {
      const xa = r * n;
      const xb = xa + n;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      let b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let j = 0; j < n; j++) {
        const u0 = w[w0 + j]!, u1 = w[w1 + j]!, u2 = w[w2 + j]!, u3 = w[w3 + j]!;
        let p = x[xa + j]!;
        a0 += u0 * p; a1 += u1 * p; a2 += u2 * p; a3 += u3 * p;
        p = x[xb + j]!;
        b0 += u0 * p; b1 += u1 * p; b2 += u2 * p; b3 += u3 * p;
      }
      let o = r * d + i;
      y[o] = a0; y[o + 1] = a1; y[o + 2] = a2; y[o + 3] = a3;
      o += d;
      y[o] = b0; y[o + 1] = b1; y[o + 2] = b2; y[o + 3] = b3;
      r += 2;
    }
    if (r < rows) {
      const xa = r * n;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (let j = 0; j < n; j++) {
        const p = x[xa + j]!;
        a0 += w[w0 + j]! * p; a1 += w[w1 + j]! * p; a2 += w[w2 + j]! * p; a3 += w[w3 + j]! * p;
      }
      const o = r * d + i;
      y[o] = a0; y[o + 1] = a1; y[o + 2] = a2; y[o + 3] = a3;
    }
  }
  for (; i < d; i++) {
    const w0 = wOff + i * n;
    for (let r = 0; r < rows; r++) {
      const xa = r * n;
      let a0 = 0;
      for (let j = 0; j < n; j++) a0 += w[w0 + j]! * x[xa + j]!;
      y[r * d + i] = a0;
    }
  }
}

/** One token row (decode at batch 1): eight weight rows at a time for more independent sums. */
function gemv(y: Float32Array, x: Float32Array, w: Float32Array, wOff: number, n: number, d: number): void {
  let i = 0;
  for (; i + 8 <= d; i += 8) {
    const w0 = wOff + i * n;
    const w1 = w0 + n, w2 = w1 + n, w3 = w2 + n, w4 = w3 + n, w5 = w4 + n, w6 = w5 + n, w7 = w6 + n;
    let a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (let j = 0; j < n; j++) {
      const p = x[j]!;
      a0 += w[w0 + j]! * p; a1 += w[w1 + j]! * p; a2 += w[w2 + j]! * p; a3 += w[w3 + j]! * p;
      a4 += w[w4 + j]! * p; a5 += w[w5 + j]! * p; a6 += w[w6 + j]! * p; a7 += w[w7 + j]! * p;
    }
    y[i] = a0; y[i + 1] = a1; y[i + 2] = a2; y[i + 3] = a3;
    y[i + 4] = a4; y[i + 5] = a5; y[i + 6] = a6; y[i + 7] = a7;
  }
  for (; i < d; i++) {
    const w0 = wOff + i * n;
    let a0 = 0;
    for (let j = 0; j < n; j++) a0 += w[w0 + j]! * x[j]!;
    y[i] = a0;
  }
}

/** The plain one-output-at-a-time loop: the bench's baseline and the shape matmul must equal bit for bit. */
export function matmulNaive(
  y: Float32Array,
  x: Float32Array,
  w: Float32Array,
  wOff: number,
  rows: number,
  n: number,
  d: number,
): void {
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < d; i++) {
      const w0 = wOff + i * n;
      const xa = r * n;
      let a = 0;
      for (let j = 0; j < n; j++) a += w[w0 + j]! * x[xa + j]!;
      y[r * d + i] = a;
    }
  }
}
