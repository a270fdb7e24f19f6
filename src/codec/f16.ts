// IEEE 754 binary16 conversions through the engine's Float16Array, so the codec rounds
// exactly as the pool stores (round to nearest even straight from the double; NaN,
// infinities and subnormals kept).

const f16 = new Float16Array(1);
const u16 = new Uint16Array(f16.buffer);

/** The binary16 bit pattern nearest to x. */
export function toF16Bits(x: number): number {
  f16[0] = x;
  return u16[0]!;
}

/** The number a binary16 bit pattern holds (NaN for any NaN pattern). */
export function fromF16Bits(bits: number): number {
  u16[0] = bits;
  return f16[0]!;
}

/** x rounded to the nearest binary16 value. */
export function roundF16(x: number): number {
  f16[0] = x;
  return f16[0]!;
}

/** The bytes of a Float16Array (little-endian on every platform Bun runs on), no copy. */
export function f16Bytes(a: Float16Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}
