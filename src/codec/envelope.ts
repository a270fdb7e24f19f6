// The v1 export envelope (kv-block.md, "Envelope" and "What a reader checks").
//
// Fields are read and written byte by byte on the Uint8Array itself: the reader must
// refuse before it allocates anything (no DataView, no records), and the writer
// allocates at most the one output buffer.
import { getU16, getU32, getU64, putU16, putU32, putU64 } from "./bytes.ts";
import { crc32c } from "./crc32c.ts";
import { EnvError, hex32, hex64 } from "./env-error.ts";
import { blockPayloadBytes, copyPayload, type KvShape } from "./kv-shape.ts";

const ENVELOPE_VERSION = 1;
const DTYPE_F16 = 1;
/** magic "TLKV" read as a little-endian u32. */
export const MAGIC = 0x564b4c54;
/** The layout (kv-block.md): a 28-byte header, per record a 12-byte head (u64 hash, u32 fill) and P payload bytes, a trailing u32 CRC. */
export const HEADER_BYTES = 28;
export const RECORD_HEAD_BYTES = 12;
export const CRC_BYTES = 4;
const U64_MAX = 0xffffffffffffffffn;

export interface EnvelopeHeader {
  version: number;
  dtype: number;
  nBlocks: number;
  blockTokens: number;
  nLayers: number;
  nKvHeads: number;
  headDim: number;
}

export interface EnvelopeRecord {
  /** chained block hash; 0n = none (partial tail, or a full block the writer does not own) */
  hash: bigint;
  /** the fill, 1..B */
  nTokens: number;
  /** P bytes, layout of kv-block.md; from readEnvelope a view into the envelope */
  payload: Uint8Array;
}

function isU32(v: number): boolean {
  return Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
}

function headerShape(h: EnvelopeHeader): KvShape {
  return { blockTokens: h.blockTokens, nLayers: h.nLayers, nKvHeads: h.nKvHeads, headDim: h.headDim };
}

/** Writes the 28-byte header of a v1 f16 envelope of `nBlocks` blocks of `shape` at `b[o]`. */
export function putEnvelopeHeader(b: Uint8Array, o: number, nBlocks: number, shape: KvShape): void {
  putU32(b, o, MAGIC);
  putU16(b, o + 4, ENVELOPE_VERSION);
  putU16(b, o + 6, DTYPE_F16);
  putU32(b, o + 8, nBlocks);
  putU32(b, o + 12, shape.blockTokens);
  putU32(b, o + 16, shape.nLayers);
  putU32(b, o + 20, shape.nKvHeads);
  putU32(b, o + 24, shape.headDim);
}

/** Writes a record head (u64 hash, u32 fill) at `b[o]`. */
export function putRecordHead(b: Uint8Array, o: number, hash: bigint, fill: number): void {
  putU64(b, o, hash);
  putU32(b, o + 8, fill);
}

/**
 * Writes a v1 envelope: header, one record per entry, CRC-32C. Writes into `out` when
 * it is large enough (returning the used prefix), else into one fresh buffer. Slots at
 * and past each record's fill are written as zeros whatever the payload holds there.
 * Inputs a v1 reader would refuse are programmer errors and throw.
 */
export function writeEnvelope(header: EnvelopeHeader, records: readonly EnvelopeRecord[], out?: Uint8Array): Uint8Array {
  const { blockTokens: B, nLayers: L, nKvHeads: H, headDim: D } = header;
  if (header.version !== ENVELOPE_VERSION || header.dtype !== DTYPE_F16) {
    throw new Error(`this writer writes version 1 dtype 1 only, got version ${header.version} dtype ${header.dtype}`);
  }
  if (header.nBlocks !== records.length) {
    throw new Error(`header.nBlocks ${header.nBlocks} != records.length ${records.length}`);
  }
  for (const [name, v] of [
    ["blockTokens", B],
    ["nLayers", L],
    ["nKvHeads", H],
    ["headDim", D],
  ] as const) {
    if (!isU32(v) || v < 1) throw new Error(`${name} ${v} must be a u32 ≥ 1`);
  }
  const P = blockPayloadBytes(headerShape(header));
  const E = HEADER_BYTES + records.length * (RECORD_HEAD_BYTES + P) + CRC_BYTES;
  if (!Number.isSafeInteger(E) || E > 0xffffffff) throw new Error(`envelope of ${records.length} blocks of ${P} bytes is too large`);

  for (let i = 0; i < records.length; i++) {
    const r = records[i]!;
    if (r.payload.length !== P) throw new Error(`record ${i}: payload is ${r.payload.length} bytes, want P = ${P}`);
    if (!(Number.isInteger(r.nTokens) && r.nTokens >= 1 && r.nTokens <= B)) {
      throw new Error(`record ${i}: fill ${r.nTokens} not in 1..${B}`);
    }
    if (r.hash < 0n || r.hash > U64_MAX) throw new Error(`record ${i}: hash ${r.hash} is not a u64`);
    if (r.hash !== 0n && r.nTokens !== B) {
      throw new Error(`record ${i}: hash ${hex64(r.hash)} on a partial block (fill ${r.nTokens} of ${B})`);
    }
  }

  const buf = out && out.length >= E ? out.subarray(0, E) : new Uint8Array(E);
  const shape = headerShape(header);
  putEnvelopeHeader(buf, 0, records.length, shape);
  let o = HEADER_BYTES;
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!;
    putRecordHead(buf, o, r.hash, r.nTokens);
    o += RECORD_HEAD_BYTES;
    copyPayload(buf, o, r.payload, r.nTokens, shape);
    o += P;
  }
  putU32(buf, o, crc32c(buf.subarray(0, o)));
  return buf;
}

/**
 * Applies reader rules 1..9 in order to the raw bytes and returns the header; throws
 * EnvError on the first rule broken. Allocates nothing but the returned header.
 */
export function verifyEnvelope(buf: Uint8Array, expect?: KvShape): EnvelopeHeader {
  const len = buf.length;
  if (len < HEADER_BYTES + CRC_BYTES) throw new EnvError("Format", 1, `envelope is ${len} bytes, need ≥ 32`);

  const magic = getU32(buf, 0);
  if (magic !== MAGIC) throw new EnvError("Format", 2, `bad magic: got ${hex32(magic)}, want ${hex32(MAGIC)} ("TLKV")`);

  const stored = getU32(buf, len - CRC_BYTES);
  const computed = crc32c(buf.subarray(0, len - CRC_BYTES));
  if (stored !== computed) {
    throw new EnvError("Format", 3, `crc mismatch: got ${hex32(stored)}, want ${hex32(computed)} (over ${len - CRC_BYTES} bytes)`);
  }

  const version = getU16(buf, 4);
  if (version !== ENVELOPE_VERSION) throw new EnvError("Version", 4, `version ${version} not readable, this reader reads 1`);
  const dtype = getU16(buf, 6);
  if (dtype !== DTYPE_F16) throw new EnvError("Version", 5, `dtype ${dtype} not readable, this reader reads 1 (f16)`);

  const n = getU32(buf, 8);
  const B = getU32(buf, 12);
  const L = getU32(buf, 16);
  const H = getU32(buf, 20);
  const D = getU32(buf, 24);
  if (B < 1 || L < 1 || H < 1 || D < 1) {
    throw new EnvError("Format", 6, `zero dimension: B=${B} L=${L} H=${H} D=${D}`);
  }
  // P = 4·L·H·B·D can reach 2^130. As a double the product is exact up to 2^53 and,
  // rounding being monotone, never falls below 2^53 past it, so any P too big for the
  // buffer still compares as too big. E = 32 + n·(12+P) is then checked by division,
  // so n·(12+P) is never formed.
  const body = len - HEADER_BYTES - CRC_BYTES;
  const P = 4 * L * H * B * D;
  const rec = RECORD_HEAD_BYTES + P;
  if (rec > body ? n !== 0 || body !== 0 : body % rec !== 0 || body / rec !== n) {
    throw new EnvError("Format", 6, `length ${len} != E = 28 + ${n}·(12 + P) + 4 with P = 4·${L}·${H}·${B}·${D}${rec <= body ? ` = ${P}` : ""}`);
  }

  if (expect && (B !== expect.blockTokens || L !== expect.nLayers || H !== expect.nKvHeads || D !== expect.headDim)) {
    throw new EnvError(
      "Shape",
      7,
      `shape B=${B} L=${L} H=${H} D=${D}, pool wants B=${expect.blockTokens} L=${expect.nLayers} H=${expect.nKvHeads} D=${expect.headDim}`,
    );
  }

  for (let i = 0, o = HEADER_BYTES; i < n; i++, o += rec) {
    const fill = getU32(buf, o + 8);
    if (fill < 1 || fill > B) throw new EnvError("Format", 8, `record ${i}: fill ${fill} not in 1..${B}`);
  }
  for (let i = 0, o = HEADER_BYTES; i < n; i++, o += rec) {
    const fill = getU32(buf, o + 8);
    if (fill !== B && (getU32(buf, o) | getU32(buf, o + 4)) !== 0) {
      throw new EnvError("Format", 9, `record ${i}: hash ${hex64(getU64(buf, o))} on a partial block (fill ${fill} of ${B})`);
    }
  }

  return { version, dtype, nBlocks: n, blockTokens: B, nLayers: L, nKvHeads: H, headDim: D };
}

/**
 * Record `index` of an envelope verifyEnvelope accepted, with `header` its result; the
 * payload is a view into `buf`, not a copy.
 */
export function envelopeRecordAt(buf: Uint8Array, header: EnvelopeHeader, index: number): EnvelopeRecord {
  if (!(Number.isInteger(index) && index >= 0 && index < header.nBlocks)) {
    throw new Error(`record index ${index} not in 0..${header.nBlocks - 1}`);
  }
  const P = blockPayloadBytes(headerShape(header));
  const o = HEADER_BYTES + index * (RECORD_HEAD_BYTES + P);
  return { hash: getU64(buf, o), nTokens: getU32(buf, o + 8), payload: buf.subarray(o + RECORD_HEAD_BYTES, o + RECORD_HEAD_BYTES + P) };
}

/** Rules 1..9 in order (verifyEnvelope), then the records as zero-copy views into `buf`. */
export function readEnvelope(buf: Uint8Array, expect?: KvShape): { header: EnvelopeHeader; records: EnvelopeRecord[] } {
  const header = verifyEnvelope(buf, expect);
  const records: EnvelopeRecord[] = new Array(header.nBlocks);
  for (let i = 0; i < header.nBlocks; i++) records[i] = envelopeRecordAt(buf, header, i);
  return { header, records };
}

/**
 * Reconciles a transport's per-chunk hash with the record it carries
 * (grpc-services.md, "How the decode side takes a push"): returns the hash the block is
 * to be held under (0n: none), or null when they disagree, which the transport reports
 * as corruption. A record hash of 0 on a full
 * block is one the sender did not own; it takes the chunk's hash.
 */
export function chunkRecordHash(chunkHash: bigint, record: EnvelopeRecord, blockTokens: number): bigint | null {
  if (record.hash !== 0n) return record.hash === chunkHash ? chunkHash : null;
  if (chunkHash === 0n) return 0n;
  return record.nTokens === blockTokens ? chunkHash : null;
}
