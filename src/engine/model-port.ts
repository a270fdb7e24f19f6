import type { TokenMatcher } from "../grammar/index.ts";
import { prevToken, type RowSampling, SAMPLE_FAILED, type SeqChunk } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";

// The rows a step carries are plain data the model defines, because the model reads them: its
// forward reads SeqChunk, its thread's plan encodes RowSampling, prevToken and SAMPLE_FAILED.
// The engine (floor 2) may import them; the model (floor 1) may not import the engine, so the
// port's behaviour (post, done, depth) is the engine's and the data stays below it.
export { prevToken, type RowSampling, SAMPLE_FAILED, type SeqChunk };

/**
 * How a step posted to the model ends: once, with the tokens the model sampled by row (-1 where
 * it sampled none, SAMPLE_FAILED where it could not; a view valid until the model's next step is
 * posted), or null and the error that failed the whole step. It must not throw.
 */
export type ForwardDone = (sampled: Int32Array | null, error: Error | null) => void;

/** One step as the model sees it: what to compute, where the logits go, and which rows it samples. */
export interface StepBatch {
  readonly pool: KvPool;
  /** Per row: the tokens to compute, through the row's block table. */
  readonly chunks: readonly SeqChunk[];
  /** Where the logits go, one row of vocabSize per chunk, for each chunk's last position. */
  readonly logits: Float32Array;
  /** Per row: how the model samples it itself, or null; all null for a model without pipelineDepth. */
  readonly sampling: readonly (RowSampling | null)[];
  /** The engine needn't hear of this step's end before the next one's (the model may settle the two together). */
  readonly lazy: boolean;
}

/**
 * The one shape of model the engine drives (its StepPipeline): `post` hands a step over, and
 * `done` says when it ended, at once for a model on this thread (transformerPort), later for one
 * on its own thread (workerPort). Until `done` runs the engine keeps every block of the batch
 * referenced, so none is zeroed, imported into or handed out while the model may touch it.
 * The model reads `chunks` and `sampling` before post returns: the engine reuses their records
 * for its next step while this one runs. Every implementation is batch-invariant: a row's logits
 * do not depend on what else is in the batch.
 *
 * A model with a pipelineDepth takes the next steps while one runs (that many in flight at most,
 * ending in the order posted) and samples the rows `sampling` names itself, with the engine's
 * sampler and a copy of the request's stream; a chunk token prevToken(r) then stands for row r's
 * sampled token of the step before, so the engine posts step N + 1 of a decode before step N's
 * token is known. A model without one computes logits only, one step at a time.
 */
export interface ModelPort {
  readonly vocabSize: number;
  /** Hands one step to the model; `done` runs once, maybe before post returns. A post that throws is a failed step. */
  post(batch: StepBatch, done: ForwardDone): void;
  /** Steps in flight at most (the model samples rows itself); absent: one step, logits only. */
  readonly pipelineDepth?: number;
  /**
   * The buffer a step of `nSeq` rows should write its logits into (a model thread's shared one,
   * so nothing is copied); absent: the engine keeps its own.
   */
  logitsBuffer?(nSeq: number): Float32Array;
  /**
   * A model that samples rows itself may also sample them under a structured output: this opens
   * its own matcher for `matcher`'s grammar under `id`, with the sequence's output tokens so far
   * (`replay`) taken; rows then name it (RowSampling.constraint). The matcher there advances with
   * every token of the sequence (those it samples, and each row's input); closeConstraint drops it.
   */
  openConstraint?(id: number, matcher: TokenMatcher, replay: readonly number[]): void;
  closeConstraint?(id: number): void;
}

/** An error as `done` carries it. */
export function asError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
