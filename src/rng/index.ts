export { Pcg32, SAMPLE_STREAM, resumeRng, stream } from "./pcg32.ts";
export { MAX_TEMPERATURE, drawsPerToken, sample, validateSampling } from "./sampler.ts";
export type { SamplingConfig } from "./sampler.ts";
