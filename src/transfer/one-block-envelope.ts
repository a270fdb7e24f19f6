// The receiver's fast path through kv-block.md's reader rules for the one envelope
// shape a push carries (one block of the pool's shape), reusing the CRC the chunk
// check already computed, so an envelope's bytes are read once for both CRCs.
// Anything this does not accept goes through readEnvelope, which refuses it with the
// exact rule and message (or accepts it, e.g. a valid envelope of two blocks).
// And the sender's writer of that one shape, straight from a pool block.
import { crc32c, crc32cCombineOp, crc32cCombineWith, envelopeBytes, type EnvelopeRecord, type KvShape } from "../codec/index.ts";

const MAGIC = 0x564b4c54; // "TLKV"
const HEADER_BYTES = 28;
const RECORD_HEAD_BYTES = 12;
/** The bytes of a one-block envelope before its payload: the header and the record head. */
export const ENVELOPE_HEAD_BYTES = HEADER_BYTES + RECORD_HEAD_BYTES;
const CRC_POLY = 0x82f63b78;

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
  if (!LITTLE_ENDIAN) {
    const lo = getU32(b, o);
    const hi = getU32(b, o + 4);
    return (BigInt(hi) << 32n) | BigInt(lo);
  }
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

// CRC-32C byte table, for extending a CRC over the 4 bytes of a u32 without handing
// the native binding a 4-byte view.
const T = new Int32Array(256);
for (let i = 0; i < 256; i++) {
  let c = i;
  for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ CRC_POLY : c >>> 1;
  T[i] = c;
}

/** crc32c(le32(v), prev): the CRC of whatever gave `prev`, followed by the 4 bytes of `v`. */
export function crc32cExtendU32(prev: number, v: number): number {
  let c = ~prev ^ v;
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
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
    this.whole = crc32cExtendU32(this.inner, getU32(env, n - 4));
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
  return oneBlockRecordParts(env, 0, env.subarray(ENVELOPE_HEAD_BYTES, len - 4), getU32(env, len - 4), shape, inner);
}

/**
 * oneBlockRecord for an envelope carried in three parts (the data plane's RUN frame):
 * its first ENVELOPE_HEAD_BYTES at `head[h..]`, the payload, and the trailing CRC field.
 * `inner` is the CRC-32C of head ++ payload, as the envelope would have it.
 */
export function oneBlockRecordParts(head: Uint8Array, h: number, payload: Uint8Array, trailer: number, shape: KvShape, inner: number): EnvelopeRecord | null {
  if (ENVELOPE_HEAD_BYTES + payload.length + 4 !== envelopeBytes(shape, 1)) return null;
  if (getU32(head, h) !== MAGIC || trailer >>> 0 !== inner >>> 0) return null;
  // version 1, dtype 1, one block
  if (getU32(head, h + 4) !== 0x00010001 || getU32(head, h + 8) !== 1) return null;
  const B = shape.blockTokens;
  if (getU32(head, h + 12) !== B || getU32(head, h + 16) !== shape.nLayers || getU32(head, h + 20) !== shape.nKvHeads || getU32(head, h + 24) !== shape.headDim) {
    return null;
  }
  const r = h + HEADER_BYTES;
  const fill = getU32(head, r + 8);
  if (fill < 1 || fill > B) return null;
  if (fill !== B && (getU32(head, r) | getU32(head, r + 4)) !== 0) return null;
  return { hash: getU64(head, r), nTokens: fill, payload };
}

/** The whole envelope from its three parts: only for the slow path's exact verdict. */
export function joinEnvelope(head: Uint8Array, h: number, payload: Uint8Array, trailer: number): Uint8Array {
  const env = new Uint8Array(ENVELOPE_HEAD_BYTES + payload.length + 4);
  env.set(head.subarray(h, h + ENVELOPE_HEAD_BYTES), 0);
  env.set(payload, ENVELOPE_HEAD_BYTES);
  putU32(env, ENVELOPE_HEAD_BYTES + payload.length, trailer);
  return env;
}

/**
 * Writes one-block envelopes of `shape` from pool blocks, byte for byte what
 * writeEnvelope writes for one record. The payload is copied once, straight from the
 * pool, and the CRCs read the copy while it is still in cache.
 */
export class OneBlockEnvelopeWriter {
  /** E for one block */
  readonly bytes: number;
  private readonly payloadBytes: number;
  /** the 28 header bytes, the same for every block of the shape */
  private readonly header: Uint8Array;
  /** bytes of one [B][H][D] section and of one token slot in it */
  private readonly section: number;
  private readonly slot: number;
  /** CRC-32C of the header, and the operator shifting a CRC over P bytes */
  private readonly headerCrc: number;
  private readonly shiftP: number;

  constructor(readonly shape: KvShape) {
    this.bytes = envelopeBytes(shape, 1);
    this.payloadBytes = this.bytes - HEADER_BYTES - RECORD_HEAD_BYTES - 4;
    this.header = new Uint8Array(HEADER_BYTES);
    putU32(this.header, 0, MAGIC);
    putU32(this.header, 4, 0x00010001); // version 1, dtype 1 (f16)
    putU32(this.header, 8, 1);
    putU32(this.header, 12, shape.blockTokens);
    putU32(this.header, 16, shape.nLayers);
    putU32(this.header, 20, shape.nKvHeads);
    putU32(this.header, 24, shape.headDim);
    this.slot = shape.nKvHeads * shape.headDim * 2;
    this.section = shape.blockTokens * this.slot;
    this.headerCrc = crc32c(this.header);
    this.shiftP = crc32cCombineOp(this.payloadBytes);
  }

  /**
   * Writes the envelope of one block at `out[o, o + bytes)` and returns its chunk CRC
   * (CRC-32C of all `bytes`). `hash` ≠ 0 requires a full block (`fill` = B).
   * `payloadCrc`, the CRC-32C of `payload` when the caller knows it (KvPool.payloadCrc),
   * spares reading the payload again: the envelope CRC is the header's combined with it.
   */
  write(out: Uint8Array, o: number, hash: bigint, fill: number, payload: Uint8Array, payloadCrc: number | null = null): number {
    const B = this.shape.blockTokens;
    const P = this.payloadBytes;
    if (payload.length !== P) throw new Error(`payload is ${payload.length} bytes, want P = ${P}`);
    if (!(o >= 0 && o + this.bytes <= out.length)) throw new Error(`envelope of ${this.bytes} bytes at ${o} overruns a buffer of ${out.length}`);
    this.writeHead(out, o, hash, fill);
    const p = o + ENVELOPE_HEAD_BYTES;
    if (fill === B) {
      out.set(payload, p);
    } else {
      // Per layer K then V, each [B][H][D]: slots at and past the fill go out as zeros.
      const used = fill * this.slot;
      for (let s = 0; s < P; s += this.section) {
        out.set(payload.subarray(s, s + used), p + s);
        out.fill(0, p + s + used, p + s + this.section);
      }
    }
    const end = o + this.bytes - 4;
    const inner = payloadCrc !== null && fill === B ? this.innerCrc(out, o, payloadCrc) : crc32c(out.subarray(o, end));
    putU32(out, end, inner);
    return crc32cExtendU32(inner, inner);
  }

  /** Writes the ENVELOPE_HEAD_BYTES before the payload (header, record head) at `out[o..]`. */
  writeHead(out: Uint8Array, o: number, hash: bigint, fill: number): void {
    const B = this.shape.blockTokens;
    if (!(Number.isInteger(fill) && fill >= 1 && fill <= B)) throw new Error(`fill ${fill} not in 1..${B}`);
    if (hash !== 0n && fill !== B) throw new Error(`hash on a partial block (fill ${fill} of ${B})`);
    out.set(this.header, o);
    const r = o + HEADER_BYTES;
    putU64(out, r, hash);
    putU32(out, r + 8, fill);
  }

  /**
   * The envelope's own CRC (of everything before its trailing field) from the head at
   * `head[o..]` and the payload's CRC-32C, without reading the payload: the head's 12
   * record bytes extend the header's known CRC, then the payload's is combined in.
   */
  innerCrc(head: Uint8Array, o: number, payloadCrc: number): number {
    const r = o + HEADER_BYTES;
    let c = crc32cExtendU32(this.headerCrc, getU32(head, r));
    c = crc32cExtendU32(c, getU32(head, r + 4));
    c = crc32cExtendU32(c, getU32(head, r + 8));
    return crc32cCombineWith(this.shiftP, c, payloadCrc);
  }
}
