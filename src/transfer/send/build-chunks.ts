import assert from "node:assert";
import { crc32c, crc32cExtendU32, envelopeBytes, KV_FORMAT, OneBlockEnvelopeWriter } from "../../codec/index.ts";
import type { KvPool } from "../../pool/index.ts";
import { type KvChunkLike, putRunEntry, RUN_ENTRY_HEAD } from "../wire/index.ts";

const EMPTY = new Uint8Array(0);

/** Where a push's chunks write their envelopes when a transport asks for the bytes. */
interface Slab {
  readonly writer: OneBlockEnvelopeWriter;
  buf: Uint8Array | undefined;
  readonly bytes: number;
  readonly take: (() => Uint8Array) | undefined;
}

function slabBuffer(s: Slab): Uint8Array {
  if (s.buf === undefined) {
    const b = s.take?.();
    s.buf = b !== undefined && b.length >= s.bytes ? b : new Uint8Array(s.bytes);
  }
  return s.buf;
}

/**
 * A chunk whose envelope is still in P's pool. A transport that frames chunks itself
 * (the data plane) writes the envelope straight into its send buffer with
 * `writeEnvelope`, one copy from the pool; reading `envelope` or `crc32c` instead writes
 * it once into the push's slab and keeps it. Assigning either field replaces the pool's
 * block with the value given (fromPool turns false).
 *
 * The block must not change until the push ends: the caller's references keep it
 * allocated, and a prefilled block is not written again.
 */
export class PoolChunk implements KvChunkLike {
  readonly kvFormat = KV_FORMAT;
  private env: Uint8Array | undefined;
  private crc = 0;

  constructor(
    readonly handleId: string,
    readonly index: number,
    readonly total: number,
    readonly hash: bigint,
    readonly pool: KvPool,
    /** the pool block this chunk carries */
    readonly blockId: number,
    /** the envelope's record hash: `hash`, or 0 when P's pool does not own it */
    private readonly recordHash: bigint,
    private readonly fill: number,
    private readonly slab: Slab,
    private readonly slabOffset: number,
  ) {}

  /** True until the envelope is written into the slab (read) or replaced (assigned). */
  get fromPool(): boolean {
    return this.env === undefined;
  }

  /** Bytes of the envelope, known before it is written. */
  get envelopeBytes(): number {
    return this.env !== undefined ? this.env.length : this.slab.writer.bytes;
  }

  /** Writes the envelope at `out[o, o + envelopeBytes)` from the pool; returns its chunk CRC. */
  writeEnvelope(out: Uint8Array, o: number): number {
    const id = this.blockId;
    // A named block's payload CRC is cached in the pool; a block P does not name (record
    // hash 0) or a partial one is read for its CRC as it is copied.
    const known = this.recordHash !== 0n ? this.pool.payloadCrc(id) : null;
    return this.slab.writer.write(out, o, this.recordHash, this.fill, this.pool.payload(id), known);
  }

  /** A full block still in the pool: the data plane may send its payload as it lies there (RUN frames). */
  get whole(): boolean {
    return this.env === undefined && this.fill === this.pool.shape.blockTokens;
  }

  /**
   * Writes this chunk's RUN entry at `out[o, o + RUN_ENTRY)` (data-plane-frame.ts): its
   * hash and chunk CRC, the envelope's head and trailing CRC, all without copying the
   * payload, whose CRC the pool caches for a named block.
   */
  writeRunEntry(out: Uint8Array, o: number): void {
    const w = this.slab.writer;
    const h = o + RUN_ENTRY_HEAD;
    w.writeHead(out, h, this.recordHash, this.fill);
    const known = this.recordHash !== 0n ? this.pool.payloadCrc(this.blockId) : null;
    const inner = w.innerCrc(out, h, known ?? crc32c(this.pool.payload(this.blockId)));
    putRunEntry(out, o, this.hash, crc32cExtendU32(inner, inner), inner);
  }

  get envelope(): Uint8Array {
    if (this.env === undefined) this.materialize();
    return this.env!;
  }
  set envelope(v: Uint8Array) {
    if (this.env === undefined) this.materialize();
    this.env = v;
  }

  get crc32c(): number {
    if (this.env === undefined) this.materialize();
    return this.crc;
  }
  set crc32c(v: number) {
    if (this.env === undefined) this.materialize();
    this.crc = v;
  }

  private materialize(): void {
    const E = this.slab.writer.bytes;
    const buf = slabBuffer(this.slab);
    this.crc = this.writeEnvelope(buf, this.slabOffset);
    this.env = buf.subarray(this.slabOffset, this.slabOffset + E);
  }
}

/**
 * The chunks of one push, envelopes not yet written: `ids` are the prompt's blocks in
 * order (the full blocks, named by `hashes`, then the partial tail when ids.length =
 * hashes.length + 1). A full block D has (`present[i]`) goes as an empty chunk; every
 * other block as a one-block envelope (PoolChunk), written when a transport needs it:
 * into its send buffer, or into `slab` when large enough (see chunkSlabBytes), else into
 * one buffer allocated on first need. `slab` may be a function giving the buffer: it is
 * called only if some envelope is asked for, so a push the data plane frames from the
 * pool never takes one.
 *
 * A full block whose hash P's pool does not own (another block holds it) is written
 * with record hash 0 and named by the chunk hash, as kv-block.md asks.
 */
export function poolChunks(
  pool: KvPool,
  handleId: string,
  ids: readonly number[],
  hashes: readonly bigint[],
  present: readonly boolean[],
  slab?: Uint8Array | (() => Uint8Array),
): KvChunkLike[] {
  const nFull = hashes.length;
  assert(ids.length === nFull || ids.length === nFull + 1, `${ids.length} blocks for ${nFull} hashes`);
  assert(present.length === nFull, `${present.length} presence flags for ${nFull} hashes`);
  const writer = new OneBlockEnvelopeWriter(pool.shape);
  const E = writer.bytes;
  const need = chunkSlabBytes(pool, ids.length, hashes.length, present);
  const shared: Slab =
    typeof slab === "function"
      ? { writer, buf: undefined, bytes: need, take: slab }
      : { writer, buf: slab !== undefined && slab.length >= need ? slab : undefined, bytes: need, take: undefined };
  const total = ids.length;
  const out = new Array<KvChunkLike>(total);
  let o = 0;
  for (let i = 0; i < total; i++) {
    const id = ids[i]!;
    const hash = i < nFull ? hashes[i]! : 0n;
    if (i < nFull && present[i]) {
      out[i] = { handleId, index: i, total, hash, kvFormat: KV_FORMAT, envelope: EMPTY, crc32c: 0 };
      continue;
    }
    const owned = pool.hashOf(id);
    if (owned !== 0n && owned !== hash) assert.fail(`block ${id} owns hash ${owned}, prompt says ${hash}`);
    out[i] = new PoolChunk(handleId, i, total, hash, pool, id, owned, pool.fillOf(id), shared, o);
    o += E;
  }
  return out;
}

/**
 * poolChunks with every envelope written at once, as plain objects: the chunks are
 * views into `slab` when it is large enough (see chunkSlabBytes), else into one fresh
 * allocation.
 */
export function buildChunks(
  pool: KvPool,
  handleId: string,
  ids: readonly number[],
  hashes: readonly bigint[],
  present: readonly boolean[],
  slab?: Uint8Array,
): KvChunkLike[] {
  const out = poolChunks(pool, handleId, ids, hashes, present, slab);
  for (let i = 0; i < out.length; i++) {
    const c = out[i]!;
    if (c instanceof PoolChunk) {
      out[i] = { handleId, index: c.index, total: c.total, hash: c.hash, kvFormat: c.kvFormat, envelope: c.envelope, crc32c: c.crc32c };
    }
  }
  return out;
}

/** Bytes of envelopes buildChunks writes for these arguments. */
export function chunkSlabBytes(pool: KvPool, nIds: number, nFull: number, present: readonly boolean[]): number {
  let nEnv = nIds - nFull;
  for (let i = 0; i < nFull; i++) if (!present[i]) nEnv++;
  return nEnv * envelopeBytes(pool.shape, 1);
}
