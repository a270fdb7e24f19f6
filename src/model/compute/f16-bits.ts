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
