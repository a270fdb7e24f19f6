export { Engine, type EngineRequest } from "./engine.ts";
export type { ForwardDone, ModelPort, RowSampling, SeqChunk, StepBatch } from "./model-port.ts";
export { transformerPort } from "./transformer-port.ts";
export { WorkerPort } from "./worker-port.ts";
export type { Finish, PrefillOutput, SamplingParams } from "./sequence.ts";
export { MAX_CHARS_PER_TOKEN, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_STOP_TOKEN_IDS } from "./input-limits.ts";
