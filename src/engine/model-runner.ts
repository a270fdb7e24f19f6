import type { TokenMatcher } from "../grammar/index.ts";
import { type ForwardDone, LogitsRows, prevToken, type RowSampling, type SeqChunk } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";

// One sequence's slice of a step is the model's own type: defined once, beside forward().
export { type ForwardDone, LogitsRows, prevToken, type RowSampling, type SeqChunk };

/**
 * What the engine loop needs from a model: write each chunk's K/V into the pool through
 * the block table and return the logits of each chunk's last position. Implementations
 * must be batch-invariant: a sequence's logits may not depend on what else is in `batch`.
 *
 * forward is synchronous for a model on the engine's thread, and returns a promise for one on
 * another thread (a model worker): until it settles the engine keeps every block of `batch`
 * referenced, so none is zeroed, imported into or handed out while the model may touch it.
 */
export interface ModelRunner {
  readonly vocabSize: number;
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void | Promise<void>;
  /**
   * The buffer forward should write `nSeq` sequences' logits into (a model thread's shared
   * one, so nothing is copied); absent: the engine keeps its own.
   */
  logitsBuffer?(nSeq: number): Float32Array;
  /**
   * forward for a model that takes the next steps while this one runs (a model thread;
   * pipelineDepth in flight at most, settling in order): the rows `sampling` names are sampled by
   * the model itself (with the engine's sampler and a copy of the request's stream), and the
   * promise settles with their tokens by row (-1 elsewhere). A chunk token prevToken(r) stands for
   * row r's sampled token of the forward before, so the engine can post step N + 1 of a decode
   * before step N's token is known. `lazy`: the caller needn't hear of this forward's end before
   * the next one's, so the model may settle the two together (one wake of the caller's thread for
   * both, while a third still runs). It reads `batch` and `sampling` before it returns: the engine
   * reuses their records for its next step while this one runs.
   */
  forwardPipelined?(
    pool: KvPool,
    batch: readonly SeqChunk[],
    out: Float32Array,
    sampling: readonly (RowSampling | null)[],
    lazy?: boolean,
  ): Promise<Int32Array>;
  /**
   * forwardPipelined with a callback for its end instead of a promise (a model thread's own
   * way): `done` runs once, with the sampled tokens or the error, possibly before post returns;
   * it must not throw. The engine prefers it, so settling a step makes no promise.
   */
  post?(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array, sampling: readonly (RowSampling | null)[], lazy: boolean, done: ForwardDone): void;
  /** Forwards forwardPipelined takes in flight at most (default 2). */
  readonly pipelineDepth?: number;
  /**
   * A model that samples rows itself may also sample them under a structured output: this opens
   * its own matcher for `matcher`'s grammar under `id`, with the sequence's output tokens so far
   * (`replay`) taken; rows then name it (RowSampling.constraint). The matcher there advances with
   * every token of the sequence (those it samples, and each row's input); closeConstraint drops it.
   */
  openConstraint?(id: number, matcher: TokenMatcher, replay: readonly number[]): void;
  closeConstraint?(id: number): void;
}
