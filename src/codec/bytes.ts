// Little-endian fields read and written byte by byte on the Uint8Array itself (any
// offset, no DataView): the one set of helpers for the envelope and every frame layout.

export function getU16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}

export function putU16(b: Uint8Array, o: number, v: number): void {
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
}

export function getU32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

export function putU32(b: Uint8Array, o: number, v: number): void {
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
  b[o + 2] = (v >>> 16) & 0xff;
  b[o + 3] = (v >>> 24) & 0xff;
}

// u64 fields through one 8-byte scratch: no BigInt arithmetic (each step allocates).
const scratch64 = new BigUint64Array(1);
const scratch8 = new Uint8Array(scratch64.buffer);
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** The u64 at `b[o]`, little-endian. */
export function getU64(b: Uint8Array, o: number): bigint {
  if (!LITTLE_ENDIAN) return (BigInt(getU32(b, o + 4)) << 32n) | BigInt(getU32(b, o));
  for (let k = 0; k < 8; k++) scratch8[k] = b[o + k]!;
  return scratch64[0]!;
}

/** Writes the u64 `v` (0 ≤ v < 2^64) at `b[o]`, little-endian. */
export function putU64(b: Uint8Array, o: number, v: bigint): void {
  if (!LITTLE_ENDIAN) {
    putU32(b, o, Number(v & 0xffffffffn));
    putU32(b, o + 4, Number((v >> 32n) & 0xffffffffn));
    return;
  }
  scratch64[0] = v;
  for (let k = 0; k < 8; k++) b[o + k] = scratch8[k]!;
}
