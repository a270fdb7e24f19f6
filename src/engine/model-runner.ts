import type { KvPool } from "../pool/index.ts";

/** One sequence's slice of a step: `tokens` sit at positions startPos.. of the sequence. */
export interface SeqChunk {
  blockTable: ArrayLike<number>;
  startPos: number;
  tokens: ArrayLike<number>;
}

/**
 * What the engine loop needs from a model: write each chunk's K/V into the pool through
 * the block table and return the logits of each chunk's last position. Implementations
 * must be batch-invariant: a sequence's logits may not depend on what else is in `batch`.
 */
export interface ModelRunner {
  readonly vocabSize: number;
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void;
}
