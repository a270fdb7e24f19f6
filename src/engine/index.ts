export { Engine, type EngineOptions, type EngineRequest, type EngineStats } from "./engine.ts";
export type { ModelRunner, SeqChunk } from "./model-runner.ts";
export type { Finish, FinishReason, PrefillOutput, SamplingParams } from "./sequence.ts";
