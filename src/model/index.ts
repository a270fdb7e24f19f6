// src/model: the model the engine runs, in three rooms (load/, compute/, thread/). What rooms outside src/model use.
export {
  type DType,
  holdWeights,
  kvShapeOf,
  type KvPoolSize,
  type KvSlab,
  type ModelConfig,
  type SeqChunk,
  Transformer,
  weightsBytes,
} from "./compute/index.ts";
export {
  loadLlama2cCheckpoint,
  loadModel,
  type LoadModelOptions,
  loadSyntheticModel,
  loadTokenizerFor,
  type ServableModel,
  servingEosIds,
  SYNTHETIC_MODEL_NAME,
  type WeightStats,
} from "./load/index.ts";
export { dropFirst, LogitsRows, ModelWorker, prevToken, type RowSampling, SAMPLE_FAILED } from "./thread/index.ts";
