import assert from "node:assert";
import { crc32c, DTYPE_F16, ENVELOPE_VERSION, envelopeBytes, writeEnvelope, type EnvelopeHeader, type EnvelopeRecord } from "../codec/index.ts";
import type { KvPool } from "../pool/index.ts";
import { KV_FORMAT, type KvChunkLike } from "./kv-chunk.ts";

const EMPTY = new Uint8Array(0);

/**
 * The chunks of one push: `ids` are the prompt's blocks in order (the full blocks,
 * named by `hashes`, then the partial tail when ids.length = hashes.length + 1).
 * A full block D has (`present[i]`) goes as an empty chunk; every other block as a
 * one-block envelope. All envelopes share one buffer: `slab` when it is large enough
 * (see chunkSlabBytes; the chunks are views into it), else one fresh allocation.
 *
 * A full block whose hash P's pool does not own (another block holds it) is written
 * with record hash 0 and named by the chunk hash, as kv-block.md asks.
 */
export function buildChunks(
  pool: KvPool,
  handleId: string,
  ids: readonly number[],
  hashes: readonly bigint[],
  present: readonly boolean[],
  slab?: Uint8Array,
): KvChunkLike[] {
  const nFull = hashes.length;
  assert(ids.length === nFull || ids.length === nFull + 1, `${ids.length} blocks for ${nFull} hashes`);
  assert(present.length === nFull, `${present.length} presence flags for ${nFull} hashes`);
  const shape = pool.shape;
  const E = envelopeBytes(shape, 1);
  const need = chunkSlabBytes(pool, ids.length, hashes.length, present);
  const buf = slab !== undefined && slab.length >= need ? slab : new Uint8Array(need);
  const header: EnvelopeHeader = { version: ENVELOPE_VERSION, dtype: DTYPE_F16, nBlocks: 1, ...shape };
  const rec: EnvelopeRecord = { hash: 0n, nTokens: 0, payload: EMPTY };
  const one = [rec];
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
    assert(owned === 0n || owned === hash, `block ${id} owns hash ${owned}, prompt says ${hash}`);
    rec.hash = owned;
    rec.nTokens = pool.fillOf(id);
    rec.payload = pool.payload(id);
    const env = writeEnvelope(header, one, buf.subarray(o, o + E));
    o += E;
    // The chunk CRC covers the envelope's own trailing CRC: extend that over its 4 bytes
    // instead of reading the envelope a second time.
    const n = env.length;
    const own = (env[n - 4]! | (env[n - 3]! << 8) | (env[n - 2]! << 16) | (env[n - 1]! << 24)) >>> 0;
    out[i] = { handleId, index: i, total, hash, kvFormat: KV_FORMAT, envelope: env, crc32c: crc32c(env.subarray(n - 4), own) };
  }
  return out;
}

/** Bytes of envelopes buildChunks writes for these arguments. */
export function chunkSlabBytes(pool: KvPool, nIds: number, nFull: number, present: readonly boolean[]): number {
  let nEnv = nIds - nFull;
  for (let i = 0; i < nFull; i++) if (!present[i]) nEnv++;
  return nEnv * envelopeBytes(pool.shape, 1);
}
