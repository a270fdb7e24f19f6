// f16 bits <-> values, shared by the packed dtypes (packed.ts) and the K-quant blocks (k-quants.ts).

let f16Table: Float32Array | null = null;

/** f16 bits -> value, exact (the engine's own Float16Array conversion, tabulated once). */
export function f16Values(): Float32Array {
  if (f16Table === null) {
    const bits = new Uint16Array(65536);
    for (let i = 0; i < 65536; i++) bits[i] = i;
    f16Table = new Float32Array(new Float16Array(bits.buffer));
  }
  return f16Table;
}

const f16Scratch = new Float16Array(1);
const f16ScratchBits = new Uint16Array(f16Scratch.buffer);

/** A number's nearest f16 (ties to even), as bits. */
export function f16Bits(x: number): number {
  f16Scratch[0] = x;
  return f16ScratchBits[0]!;
}

/**
 * f16 bits h in the shifted coding the kernels place f16 weights in (kernels/assembly/f16.ts' THE
 * SHIFTED F16, which f16Shift there writes the same): the exponent field raised by 10, so the
 * pattern's value is 2^(field - 25) (1 + mantissa / 1024) and a subnormal becomes a normal; zero
 * kept. Defined for |value| < 128 (h & 0x7fff < 0x5800) only.
 */
export function f16Shift(h: number): number {
  const em = h & 0x7fff;
  if (em === 0) return h;
  if (em >= 0x400) return h + 0x2800;
  const k = 31 - Math.clz32(em);
  return (h & 0x8000) | ((k + 1) << 10) | ((em << (10 - k)) & 0x3ff);
}

/** f16Shift undone: the plain f16 bits of a shifted pattern. */
export function f16Unshift(s: number): number {
  const em = s & 0x7fff;
  if (em === 0) return s;
  if (em >= 0x2c00) return s - 0x2800;
  const k = (em >> 10) - 1;
  return (s & 0x8000) | ((0x400 | (em & 0x3ff)) >> (10 - k));
}
