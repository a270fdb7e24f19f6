import type { SeqChunk } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";
import { asError, type ModelPort } from "./model-port.ts";

/** What the adapter needs of a model on this thread: a synchronous forward (the Transformer's). */
export interface SyncModel {
  readonly cfg: { readonly vocabSize: number };
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void;
}

/**
 * A model on the engine's thread as the engine's port: each step runs inside post and ends
 * there, so one step is in flight at most and the engine samples every row itself. A forward
 * that throws is that step's failure, reported through `done` like a model thread's.
 */
export function transformerPort(model: SyncModel): ModelPort {
  return {
    vocabSize: model.cfg.vocabSize,
    post(batch, done) {
      try {
        model.forward(batch.pool, batch.chunks, batch.logits);
      } catch (e) {
        done(null, asError(e));
        return;
      }
      done(null, null);
    },
  };
}
