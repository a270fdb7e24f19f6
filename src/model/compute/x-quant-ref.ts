/**
 * A token row of x quantized as the integer kernels take it, in plain JS (the references'
 * and the fallback's one statement of it): per block of `block` elements s = max|x| / 127,
 * q = nearest-even(clamp(x * (s == 0 ? 0 : 1 / s), lo, hi)), a NaN giving 0, every step in f32.
 * q8.ts's quantize_q8_x is block 32, [-32768, 32767] (i16 saturation); kquants.ts's quantize_k_x
 * block 256 and legacy.ts's quantize_l_x block 32, both [-127, 127]. The row lands in xRef's
 * arrays, grown as needed (the fallback runs on one thread).
 */
export const xRef = { q: new Int32Array(0), scales: new Float32Array(0) };

export function quantizeXRef(x: Float32Array, xa: number, n: number, block: number, lo: number, hi: number): void {
  const f = Math.fround;
  if (xRef.q.length < n || xRef.scales.length < n / block) {
    xRef.q = new Int32Array(n);
    xRef.scales = new Float32Array(n / 32);
  }
  const { q, scales } = xRef;
  for (let b = 0; b < n / block; b++) {
    let a = 0;
    for (let j = 0; j < block; j++) a = Math.max(a, Math.abs(x[xa + b * block + j]!));
    const s = f(a / 127);
    const inv = s === 0 ? 0 : f(1 / s);
    scales[b] = s;
    for (let j = 0; j < block; j++) {
      const v = Math.min(Math.max(f(x[xa + b * block + j]! * inv), lo), hi);
      const r = Math.round(v);
      // Math.round takes halves up; the kernels' f32x4.nearest takes them to even.
      q[b * block + j] = Number.isNaN(v) ? 0 : r - v === 0.5 && (r & 1) !== 0 ? r - 1 : r;
    }
  }
}
