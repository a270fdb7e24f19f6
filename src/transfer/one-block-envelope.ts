// The receiver's fast path through kv-block.md's reader rules for the one envelope
// shape a push carries (one block of the pool's shape), reusing the CRC the chunk
// check already computed, so an envelope's bytes are read once for both CRCs.
// Anything this does not accept goes through readEnvelope, which refuses it with the
// exact rule and message (or accepts it, e.g. a valid envelope of two blocks).
import { crc32c, envelopeBytes, type EnvelopeRecord, type KvShape } from "../codec/index.ts";

const MAGIC = 0x564b4c54; // "TLKV"
const HEADER_BYTES = 28;
const RECORD_HEAD_BYTES = 12;

function getU32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

/**
 * CRC-32C of a chunk's `envelope` in one pass, split at its last 4 bytes: `inner` is
 * the CRC of [0, len-4) (what reader rule 3 compares with the trailing field), `whole`
 * the CRC of all of it (the chunk's crc32c field), extended from `inner` over 4 bytes.
 */
export class EnvelopeCrc {
  inner = 0;
  whole = 0;

  compute(env: Uint8Array): void {
    const n = env.length;
    if (n < 4) {
      this.inner = 0;
      this.whole = crc32c(env);
      return;
    }
    this.inner = crc32c(env.subarray(0, n - 4));
    this.whole = crc32c(env.subarray(n - 4), this.inner);
  }
}

/**
 * The record of `env` when it passes reader rules 1..9 as a one-block envelope of
 * `shape`, given `inner` = CRC-32C of its first len-4 bytes; null otherwise (the caller
 * then runs readEnvelope for the verdict). Every rule holds when this accepts: the length
 * is E for n = 1 and the pool's (≥ 1) dimensions, which the header repeats.
 */
export function oneBlockRecord(env: Uint8Array, shape: KvShape, inner: number): EnvelopeRecord | null {
  const len = env.length;
  if (len !== envelopeBytes(shape, 1)) return null;
  if (getU32(env, 0) !== MAGIC || getU32(env, len - 4) !== inner) return null;
  // version 1, dtype 1, one block
  if (getU32(env, 4) !== 0x00010001 || getU32(env, 8) !== 1) return null;
  const B = shape.blockTokens;
  if (getU32(env, 12) !== B || getU32(env, 16) !== shape.nLayers || getU32(env, 20) !== shape.nKvHeads || getU32(env, 24) !== shape.headDim) {
    return null;
  }
  const lo = getU32(env, HEADER_BYTES);
  const hi = getU32(env, HEADER_BYTES + 4);
  const fill = getU32(env, HEADER_BYTES + 8);
  if (fill < 1 || fill > B) return null;
  if (fill !== B && (lo | hi) !== 0) return null;
  const p = HEADER_BYTES + RECORD_HEAD_BYTES;
  return {
    hash: hi === 0 ? BigInt(lo) : (BigInt(hi) << 32n) | BigInt(lo),
    nTokens: fill,
    payload: env.subarray(p, len - 4),
  };
}
