import { DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, type ModelConfig, syntheticWeights, type Weights } from "../compute/index.ts";
import { ByteTokenizer, type Tokenizer } from "../../tokenizer/index.ts";

export const SYNTHETIC_MODEL_NAME = "tl-synthetic-4l";
const SYNTHETIC_SEED = 0x746c3034; // "tl04"

/** The embedded default model: small enough to start instantly, big enough to exercise GQA and paging. */
export const SYNTHETIC_CONFIG: Readonly<ModelConfig> = Object.freeze({
  name: SYNTHETIC_MODEL_NAME,
  dim: 256,
  hiddenDim: 768,
  nLayers: 4,
  nHeads: 8,
  nKvHeads: 4,
  vocabSize: 258,
  maxSeqLen: 2048,
  ropeTheta: DEFAULT_ROPE_THETA,
  normEps: DEFAULT_NORM_EPS,
});

export interface LoadedModel {
  cfg: ModelConfig;
  weights: Weights;
  tokenizer: Tokenizer;
}

/**
 * tl-synthetic-4l with weights from a fixed seed (the same bits on every machine). The classifier
 * rows of bytes outside printable ASCII and newline, and of BOS/EOS, are zero, so they score 0
 * against logits of std ~4: generated text is mostly printable and EOS is rare but possible.
 */
export function loadSyntheticModel(): LoadedModel {
  const cfg: ModelConfig = { ...SYNTHETIC_CONFIG };
  const weights = syntheticWeights(cfg, SYNTHETIC_SEED);
  for (let id = 0; id < cfg.vocabSize; id++) {
    const printable = (id >= 0x20 && id <= 0x7e) || id === 0x0a;
    if (!printable) weights.wcls.fill(0, id * cfg.dim, (id + 1) * cfg.dim);
  }
  return { cfg, weights, tokenizer: new ByteTokenizer() };
}
