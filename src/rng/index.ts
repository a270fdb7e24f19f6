export { Pcg32, SAMPLE_STREAM, resumeRng, stream } from "./pcg32.ts";
export { LogitsError, MAX_TEMPERATURE, drawsPerToken, sample, validateSampling } from "./sampler.ts";
export type { SamplingConfig } from "./sampler.ts";
export {
  applyTokenBitmask,
  compileLogits,
  isIdentity,
  LOGIT_BIAS_LIMIT,
  maskStops,
  MAX_REPETITION_PENALTY,
  MIN_REPETITION_PENALTY,
  NO_PROCESSING,
  PENALTY_LIMIT,
  processLogits,
  TokenHistory,
  validateLogits,
} from "./logits-processor.ts";
export type { CompiledLogits, LogitsConfig } from "./logits-processor.ts";
export { MAX_TOP_LOGPROBS, tokenLogprobs } from "./logprobs.ts";
export type { TokenLogprobs } from "./logprobs.ts";
export { choiceSeed, MAX_CHOSEN_SEED, randomSeed } from "./seed.ts";
