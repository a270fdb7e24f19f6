import type { SeqChunk } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";

// One sequence's slice of a step is the model's own type: defined once, beside forward().
export type { SeqChunk };

/**
 * What the engine loop needs from a model: write each chunk's K/V into the pool through
 * the block table and return the logits of each chunk's last position. Implementations
 * must be batch-invariant: a sequence's logits may not depend on what else is in `batch`.
 */
export interface ModelRunner {
  readonly vocabSize: number;
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void;
}
