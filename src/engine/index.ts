export { Engine, type EngineOptions, type EngineRequest, type EngineStats } from "./engine.ts";
export type { ForwardDone, ModelPort, RowSampling, SeqChunk, StepBatch } from "./model-port.ts";
export { transformerPort, type SyncModel } from "./transformer-port.ts";
export { WorkerPort } from "./worker-port.ts";
export type { Finish, FinishReason, PrefillOutput, SamplingParams } from "./sequence.ts";
export { MAX_CHARS_PER_TOKEN, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_STOP_TOKEN_IDS } from "./input-limits.ts";
