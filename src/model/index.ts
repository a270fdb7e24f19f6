export {
  type ModelConfig,
  DEFAULT_NORM_EPS,
  DEFAULT_ROPE_THETA,
  headDimOf,
  kvDimOf,
  kvShapeOf,
  validateConfig,
} from "./config.ts";
export { type Weights, type SyntheticOptions, castWeights, syntheticWeights, validateWeights, weightSizes, weightsDType } from "./weights.ts";
export { type DType, type Matrix, type PackedMatrix, DTYPES, castMatrix, dequantize } from "./packed.ts";
export { type SeqChunk, Transformer } from "./transformer.ts";
export { type EncodeOptions, type Tokenizer, ByteTokenizer, StreamDecoder } from "./tokenizer.ts";
export { type LoadedModel, SYNTHETIC_CONFIG, SYNTHETIC_MODEL_NAME, loadSyntheticModel } from "./synthetic.ts";
export {
  type Llama2cModel,
  type VocabEntry,
  Llama2cTokenizer,
  encodeLlama2cCheckpoint,
  encodeLlama2cTokenizer,
  loadLlama2cCheckpoint,
  loadLlama2cTokenizer,
  parseLlama2cCheckpoint,
  parseLlama2cTokenizer,
  writeLlama2cCheckpoint,
  writeLlama2cTokenizer,
} from "./llama2c.ts";
