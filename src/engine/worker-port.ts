import type { TokenMatcher } from "../grammar/index.ts";
import type { ModelWorker } from "../model/index.ts";
import type { ForwardDone, ModelPort, StepBatch } from "./model-port.ts";

/**
 * A model on its own thread as the engine's port: ModelWorker.post already ends each step
 * through a callback, in the order posted, and samples the rows the step names; this binds its
 * positional arguments to one StepBatch.
 */
export class WorkerPort implements ModelPort {
  readonly vocabSize: number;
  readonly pipelineDepth: number;

  constructor(readonly worker: ModelWorker) {
    this.vocabSize = worker.vocabSize;
    this.pipelineDepth = worker.pipelineDepth;
  }

  post(b: StepBatch, done: ForwardDone): void {
    this.worker.post(b.pool, b.chunks, b.logits, b.sampling, b.lazy, done);
  }
  logitsBuffer(nSeq: number): Float32Array {
    return this.worker.logitsBuffer(nSeq);
  }
  openConstraint(id: number, matcher: TokenMatcher, replay: readonly number[]): void {
    this.worker.openConstraint(id, matcher, replay);
  }
  closeConstraint(id: number): void {
    this.worker.closeConstraint(id);
  }
}
