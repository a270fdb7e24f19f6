export { Pcg32, SAMPLE_STREAM, resumeRng, stream } from "./pcg32.ts";
export { LogitsError, drawsPerToken, sample, validateSampling } from "./sampler.ts";
export type { SamplingConfig } from "./sampler.ts";
export { applyTokenBitmask, compileLogits, isIdentity, maskStops, processLogits, TokenHistory, validateLogits } from "./logits-processor.ts";
export type { CompiledLogits, LogitsConfig } from "./logits-processor.ts";
export { MAX_TOP_LOGPROBS, tokenLogprobs } from "./logprobs.ts";
export type { TokenLogprobs } from "./logprobs.ts";
export { choiceSeed, randomSeed } from "./seed.ts";
