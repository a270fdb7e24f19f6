// The one envelope shape a push carries, one block of the pool's shape, on both sides:
// the receiver's fast path through kv-block.md's reader rules, reusing the CRC the chunk
// check already computed so an envelope's bytes are read once for both CRCs (anything it
// does not accept goes through readEnvelope, which refuses it with the exact rule and
// message, or accepts it, e.g. a valid envelope of two blocks), and the sender's writer
// straight from a pool block. Layout, header and payload copy are envelope.ts' own.
import { getU32, getU64, putU32 } from "./bytes.ts";
import { crc32c, crc32cCombineOp, crc32cCombineWith, crc32cExtendU32 } from "./crc32c.ts";
import { CRC_BYTES, type EnvelopeRecord, HEADER_BYTES, MAGIC, putEnvelopeHeader, putRecordHead, RECORD_HEAD_BYTES } from "./envelope.ts";
import { copyPayload, envelopeBytes, type KvShape } from "./kv-shape.ts";

/** The bytes of a one-block envelope before its payload: the header and the record head. */
export const ENVELOPE_HEAD_BYTES = HEADER_BYTES + RECORD_HEAD_BYTES;

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
    if (n < CRC_BYTES) {
      this.inner = 0;
      this.whole = crc32c(env);
      return;
    }
    this.inner = crc32c(env.subarray(0, n - CRC_BYTES));
    this.whole = crc32cExtendU32(this.inner, getU32(env, n - CRC_BYTES));
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
  return oneBlockRecordParts(env, 0, env.subarray(ENVELOPE_HEAD_BYTES, len - CRC_BYTES), getU32(env, len - CRC_BYTES), shape, inner);
}

/**
 * oneBlockRecord for an envelope carried in three parts (the data plane's RUN frame):
 * its first ENVELOPE_HEAD_BYTES at `head[h..]`, the payload, and the trailing CRC field.
 * `inner` is the CRC-32C of head ++ payload, as the envelope would have it.
 */
export function oneBlockRecordParts(head: Uint8Array, h: number, payload: Uint8Array, trailer: number, shape: KvShape, inner: number): EnvelopeRecord | null {
  if (ENVELOPE_HEAD_BYTES + payload.length + CRC_BYTES !== envelopeBytes(shape, 1)) return null;
  if (getU32(head, h) !== MAGIC || trailer >>> 0 !== inner >>> 0) return null;
  // version 1, dtype 1, one block
  if (getU32(head, h + 4) !== 0x00010001 || getU32(head, h + 8) !== 1) return null;
  const B = shape.blockTokens;
  if (
    getU32(head, h + 12) !== B ||
    getU32(head, h + 16) !== shape.nLayers ||
    getU32(head, h + 20) !== shape.nKvHeads ||
    getU32(head, h + 24) !== shape.headDim
  ) {
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
  const env = new Uint8Array(ENVELOPE_HEAD_BYTES + payload.length + CRC_BYTES);
  env.set(head.subarray(h, h + ENVELOPE_HEAD_BYTES), 0);
  env.set(payload, ENVELOPE_HEAD_BYTES);
  putU32(env, ENVELOPE_HEAD_BYTES + payload.length, trailer);
  return env;
}

/** CRC-32C of the ENVELOPE_HEAD_BYTES at `head[h..]`, by table, ten u32 steps: a native call and a view per block cost more. */
export function envelopeHeadCrc(head: Uint8Array, h: number): number {
  let c = 0;
  for (let o = h; o < h + ENVELOPE_HEAD_BYTES; o += 4) c = crc32cExtendU32(c, getU32(head, o));
  return c;
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
  /** CRC-32C of the header, and the operator shifting a CRC over P bytes */
  private readonly headerCrc: number;
  private readonly shiftP: number;

  constructor(readonly shape: KvShape) {
    this.bytes = envelopeBytes(shape, 1);
    this.payloadBytes = this.bytes - ENVELOPE_HEAD_BYTES - CRC_BYTES;
    this.header = new Uint8Array(HEADER_BYTES);
    putEnvelopeHeader(this.header, 0, 1, shape);
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
    const P = this.payloadBytes;
    if (payload.length !== P) throw new Error(`payload is ${payload.length} bytes, want P = ${P}`);
    if (!(o >= 0 && o + this.bytes <= out.length)) throw new Error(`envelope of ${this.bytes} bytes at ${o} overruns a buffer of ${out.length}`);
    this.writeHead(out, o, hash, fill);
    copyPayload(out, o + ENVELOPE_HEAD_BYTES, payload, fill, this.shape);
    const end = o + this.bytes - CRC_BYTES;
    const inner = payloadCrc !== null && fill === this.shape.blockTokens ? this.innerCrc(out, o, payloadCrc) : crc32c(out.subarray(o, end));
    putU32(out, end, inner);
    return crc32cExtendU32(inner, inner);
  }

  /** Writes the ENVELOPE_HEAD_BYTES before the payload (header, record head) at `out[o..]`. */
  writeHead(out: Uint8Array, o: number, hash: bigint, fill: number): void {
    const B = this.shape.blockTokens;
    if (!(Number.isInteger(fill) && fill >= 1 && fill <= B)) throw new Error(`fill ${fill} not in 1..${B}`);
    if (hash !== 0n && fill !== B) throw new Error(`hash on a partial block (fill ${fill} of ${B})`);
    out.set(this.header, o);
    putRecordHead(out, o + HEADER_BYTES, hash, fill);
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
