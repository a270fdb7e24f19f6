// Shared helpers for the codec tests.
import { expect } from "bun:test";
import { EnvError, type EnvErrorKind, type KvShape } from "../../src/codec/index.ts";

/** Runs fn, expects an EnvError, returns it. */
export function refusal(fn: () => unknown): EnvError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(EnvError);
    return e as EnvError;
  }
  throw new Error("expected an EnvError, nothing was thrown");
}

export function expectRefused(fn: () => unknown, kind: EnvErrorKind, rule: number, code: number): EnvError {
  const e = refusal(fn);
  expect({ kind: e.kind, rule: e.rule, code: e.code as number }).toEqual({ kind, rule, code });
  expect(e.message.startsWith(`rule ${rule}: `)).toBe(true);
  return e;
}

/** Element index of the D-vector (layer, kv, slot, head) inside one block, as the pool lays it out. */
export function elemOffset(s: KvShape, layer: number, kv: 0 | 1, slot: number, head: number): number {
  return ((layer * 2 + kv) * s.blockTokens + slot) * s.nKvHeads * s.headDim + head * s.headDim;
}

/** Bitwise CRC-32C straight from the definition. */
export function crc32cRef(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

/** Rewrites the trailing CRC so only the field a test changed is wrong. */
export function fixCrc(buf: Uint8Array): Uint8Array {
  new DataView(buf.buffer, buf.byteOffset, buf.byteLength).setUint32(buf.length - 4, crc32cRef(buf.subarray(0, buf.length - 4)), true);
  return buf;
}

/** Small deterministic generator (xorshift32) for test data. */
export function xorshift(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}
