import type { ModelConfig } from "../src/model/index.ts";

/** The TinyStories-15M shape the model benchmarks run (llama2.c's stories15M.bin). */
export const TS_SHAPE: ModelConfig = {
  name: "tinystories-15m-shape",
  dim: 288,
  hiddenDim: 768,
  nLayers: 6,
  nHeads: 6,
  nKvHeads: 6,
  vocabSize: 32000,
  maxSeqLen: 256,
  ropeTheta: 10000,
  normEps: 1e-5,
};
