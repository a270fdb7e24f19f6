// The one stand-in for a transformer in tests: its "KV cache" is a fixed f16 pattern of
// (position, token, layer, K/V, head, dim) written into a real KvPool, and its "logits"
// hash every cached value of the sequence, so a lost, stale, misplaced or partly
// copied block changes the next token. Engines run it as `FakeRunner`; transfer tests
// fill pools with the same pattern through `fakePrefill` and check them with `patternDigest`.
import { promptHashes, type KvShape } from "../../src/codec/index.ts";
import type { ForwardDone, ModelPort, SeqChunk, StepBatch } from "../../src/engine/index.ts";
import type { KvPool } from "../../src/pool/index.ts";

/** The value the fake model caches; multiples of 1/64 in [-16, 16), exact in f16. */
export function patternValue(pos: number, token: number, layer: number, kv: 0 | 1, head: number, dim: number): number {
  const x = (Math.imul(pos + 1, 2654435761) ^ Math.imul(token + 7, 40503) ^ (layer << 11) ^ (kv << 10) ^ (head << 7) ^ dim) >>> 0;
  return ((x % 2048) - 1024) / 64;
}

/** Writes token `token` at position `pos` into slot `slot` of block `id`. */
export function writeTokenKv(pool: KvPool, id: number, slot: number, pos: number, token: number): void {
  const { nLayers, nKvHeads, headDim } = pool.shape;
  const data = pool.data;
  for (let l = 0; l < nLayers; l++) {
    for (const kv of [0, 1] as const) {
      for (let h = 0; h < nKvHeads; h++) {
        const o = pool.offset(id, l, kv, slot, h);
        for (let d = 0; d < headDim; d++) data[o + d] = patternValue(pos, token, l, kv, h, d);
      }
    }
  }
}

export interface FakePrefill {
  /** the prompt's blocks, full then the partial tail; the caller holds one reference on each */
  ids: number[];
  /** chained hashes of the full blocks */
  hashes: bigint[];
  /** leading blocks taken from the prefix cache instead of computed */
  reused: number;
}

/**
 * Prefills `tokens` into `pool`: allocates the blocks, writes the pattern, sets fills
 * and registers the full blocks' hashes (a hash another block owns stays unregistered
 * on this one). With `reusePrefix`, cached leading blocks are acquired, as an engine
 * with a prefix cache would. Null, with nothing taken, when the pool is short.
 */
export function fakePrefill(pool: KvPool, tokens: readonly number[], opts: { reusePrefix?: boolean } = {}): FakePrefill | null {
  const B = pool.shape.blockTokens;
  const hashes = promptHashes(tokens, B);
  const nBlocks = Math.ceil(tokens.length / B);
  const ids: number[] = [];
  if (opts.reusePrefix) {
    for (const h of hashes) {
      const id = pool.lookup(h);
      if (id < 0) break;
      pool.acquire(id);
      ids.push(id);
    }
  }
  const reused = ids.length;
  const fresh = pool.allocate(nBlocks - reused);
  if (fresh === null) {
    pool.releaseAll(ids);
    return null;
  }
  ids.push(...fresh);
  for (let b = reused; b < nBlocks; b++) {
    const id = ids[b]!;
    const fill = Math.min(B, tokens.length - b * B);
    for (let s = 0; s < fill; s++) writeTokenKv(pool, id, s, b * B + s, tokens[b * B + s]!);
    pool.setFill(id, fill);
    if (b < hashes.length) pool.register(id, hashes[b]!);
  }
  return { ids, hashes, reused };
}

function mix(h: number, v: number): number {
  return Math.imul(h ^ v, 0x01000193);
}

/** A digest of every cached value of positions 0..nTokens-1 held in `ids` (in order). */
export function kvDigest(pool: KvPool, ids: ArrayLike<number>, nTokens: number): number {
  const { blockTokens: B, nLayers, nKvHeads, headDim } = pool.shape;
  const bits = new Uint16Array(pool.data.buffer);
  let h = 0x811c9dc5;
  for (let p = 0; p < nTokens; p++) {
    const id = ids[Math.floor(p / B)]!;
    for (let l = 0; l < nLayers; l++) {
      for (let kv = 0; kv < 2; kv++) {
        const o = pool.offset(id, l, kv as 0 | 1, p % B, 0);
        for (let i = 0; i < nKvHeads * headDim; i++) h = mix(h, bits[o + i]!);
      }
    }
  }
  return h >>> 0;
}

/** The digest a correct cache of `tokens` has: what kvDigest returns after a faithful prefill. */
export function patternDigest(shape: KvShape, tokens: readonly number[]): number {
  const { nLayers, nKvHeads, headDim } = shape;
  const one = new Float16Array(1);
  const bits = new Uint16Array(one.buffer);
  let h = 0x811c9dc5;
  for (let p = 0; p < tokens.length; p++) {
    for (let l = 0; l < nLayers; l++) {
      for (const kv of [0, 1] as const) {
        for (let hd = 0; hd < nKvHeads; hd++) {
          for (let d = 0; d < headDim; d++) {
            one[0] = patternValue(p, tokens[p]!, l, kv, hd, d);
            h = mix(h, bits[0]!);
          }
        }
      }
    }
  }
  return h >>> 0;
}

/** The fake model's logits for a cache with this digest: a spread distribution in [0, 4), so sampling has choices. */
export function fakeLogits(digest: number, row: Float32Array): void {
  let x = digest || 1;
  for (let v = 0; v < row.length; v++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    row[v] = ((x >>> 0) % 1000) / 250;
  }
}

/**
 * The fake model as the engine's port, a synchronous one (each step ends inside post): each
 * chunk's tokens are cached with the pattern at their positions through the block table, and
 * its logits come from the digest of the whole sequence read back through that table, so
 * nothing depends on the batch.
 */
export class FakeRunner implements ModelPort {
  forwardCalls = 0;
  tokensComputed = 0;

  /** Busy time per forward, so streams last long enough to be interrupted. */
  slowMs = 0;

  constructor(readonly vocabSize = 64) {}

  post(b: StepBatch, done: ForwardDone): void {
    this.forward(b.pool, b.chunks, b.logits);
    done(null, null);
  }

  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void {
    this.forwardCalls++;
    if (this.slowMs > 0) {
      const until = performance.now() + this.slowMs;
      while (performance.now() < until);
    }
    const B = pool.shape.blockTokens;
    for (let i = 0; i < batch.length; i++) {
      const c = batch[i]!;
      for (let t = 0; t < c.tokens.length; t++) {
        const pos = c.startPos + t;
        writeTokenKv(pool, c.blockTable[Math.floor(pos / B)]!, pos % B, pos, c.tokens[t]!);
        this.tokensComputed++;
      }
      const digest = kvDigest(pool, c.blockTable, c.startPos + c.tokens.length);
      fakeLogits(digest, out.subarray(i * this.vocabSize, (i + 1) * this.vocabSize));
    }
  }
}

/** A deterministic prompt of n token ids below `vocab`, different per `seed`. */
export function fakePrompt(n: number, seed = 1, vocab = 32000): number[] {
  const out = new Array<number>(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = (x >>> 0) % vocab;
  }
  return out;
}
