import type { KvPool } from "../pool/index.ts";
import type { BlockHold } from "./kv-cache-manager.ts";
import type { RowSampling, SeqChunk, StepBatch } from "./model-port.ts";
import type { Sequence } from "./sequence.ts";

/**
 * One step from plan to postprocess: the rows the Scheduler chose, the batch the model computes
 * (the StepBatch it is posted as), and what the forward left for postprocess. A record is reused
 * (StepPipeline.take) once its step settled and was postprocessed, its arrays refilled in place,
 * so a steady decode allocates none per step.
 */
export class Step implements StepBatch, BlockHold {
  /** Per row: its sequence, and how many of its tokens (from numComputed) the step computes. */
  readonly seqs: Sequence[] = [];
  readonly counts: number[] = [];
  /** Per row: the sequence's chunk (its own record, overwritten by its next step once this one is posted). */
  readonly chunks: SeqChunk[] = [];
  /** Per row: how the model samples it itself, or null (see Engine.modelSamples). */
  readonly sampling: (RowSampling | null)[] = [];
  /** Rows filled so far while the step is built. */
  rows = 0;
  /** Where the model writes the logits, one row per chunk. */
  logits: Float32Array;
  /**
   * Tokens in flight before this step's, 0 unless planned ahead (decodes only: then its tokens
   * may be streamed together with the next step's, so the model needn't hurry to say it ended).
   */
  ahead = 0;
  /** The forward ended (or failed: `failed`, with `error`). */
  done = false;
  failed = false;
  error: unknown = null;
  /** The tokens the model sampled for the rows `sampling` names, once the forward ended. */
  sampled: Int32Array | null = null;
  /** Blocks given back while this step ran, released when it settles (KvCacheManager.settle). */
  readonly deferred: number[] = [];
  /** The model's callback for this record's forwards (made once, reused by every step it carries). */
  readonly onDone: (sampled: Int32Array | null, error: Error | null) => void;

  constructor(
    readonly pool: KvPool,
    logits: Float32Array,
    ended: (step: Step, sampled: Int32Array | null, error: Error | null) => void,
  ) {
    this.logits = logits;
    this.onDone = (sampled, error) => ended(this, sampled, error);
  }

  get lazy(): boolean {
    return this.ahead > 0;
  }

  /** Empties the record for a step `ahead` tokens past those computed; its arrays keep their room. */
  reset(ahead: number): void {
    this.rows = 0;
    this.done = this.failed = false;
    this.error = this.sampled = null;
    this.ahead = ahead;
  }

  /** Row `rows` (the Scheduler's pick): seq computes its next `n` tokens; chunks and sampling are filled after (Engine.prepare). */
  pick(seq: Sequence, n: number): void {
    const r = this.rows++;
    this.seqs[r] = seq;
    this.counts[r] = n;
  }

  /**
   * Cuts the arrays to the rows filled (a steady decode fills as many each step: nothing moves,
   * and no length is set, each set being a call into the runtime).
   */
  seal(): void {
    const n = this.rows;
    if (this.seqs.length !== n) this.seqs.length = this.counts.length = n;
    if (this.chunks.length !== n) this.chunks.length = this.sampling.length = n;
  }
}
