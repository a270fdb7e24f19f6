import type { ModelRunner, SeqChunk } from "../../src/engine/index.ts";
import type { KvPool } from "../../src/pool/index.ts";

/**
 * A ModelRunner for engine tests: each position's K/V is a fixed f16 pattern of
 * (token, position, layer, kv, head, dim), and the logits hash every K/V value the
 * sequence has in the pool, read back through its block table. So any lost, stale or
 * misplaced block changes the next token, and nothing depends on the batch.
 */
export class FakeRunner implements ModelRunner {
  forwardCalls = 0;
  tokensComputed = 0;

  /** Busy time per forward, so streams last long enough to be interrupted. */
  slowMs = 0;

  constructor(readonly vocabSize = 64) {}

  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void {
    this.forwardCalls++;
    if (this.slowMs > 0) {
      const until = performance.now() + this.slowMs;
      while (performance.now() < until);
    }
    const { blockTokens: B, nLayers: L, nKvHeads: H, headDim: D } = pool.shape;
    for (let i = 0; i < batch.length; i++) {
      const c = batch[i]!;
      for (let t = 0; t < c.tokens.length; t++) {
        const pos = c.startPos + t;
        const id = c.blockTable[Math.floor(pos / B)]!;
        for (let l = 0; l < L; l++)
          for (const kv of [0, 1] as const)
            for (let h = 0; h < H; h++) {
              const o = pool.offset(id, l, kv, pos % B, h);
              for (let d = 0; d < D; d++) pool.data[o + d] = kvPattern(c.tokens[t]!, pos, l, kv, h, d);
            }
        this.tokensComputed++;
      }
      const last = c.startPos + c.tokens.length;
      let digest = 0x811c9dc5;
      for (let pos = 0; pos < last; pos++) {
        const id = c.blockTable[Math.floor(pos / B)]!;
        for (let l = 0; l < L; l++)
          for (const kv of [0, 1] as const)
            for (let h = 0; h < H; h++) {
              const o = pool.offset(id, l, kv, pos % B, h);
              for (let d = 0; d < D; d++) digest = Math.imul(digest ^ Math.round(pool.data[o + d]! * 64), 0x01000193) >>> 0;
            }
      }
      const row = out.subarray(i * this.vocabSize, (i + 1) * this.vocabSize);
      let x = digest || 1;
      for (let v = 0; v < this.vocabSize; v++) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        row[v] = ((x >>> 0) % 1000) / 250; // logits in [0, 4): a spread distribution
      }
    }
  }
}

export function kvPattern(token: number, pos: number, layer: number, kv: number, head: number, dim: number): number {
  return ((token * 31 + pos * 7 + layer * 3 + kv * 11 + head * 5 + dim) % 97) / 8 - 6;
}
