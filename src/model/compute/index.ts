// src/model/compute: the forward pass and what it runs on (config, weights, dtypes, kernels). What other rooms use.
export { DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, headDimOf, kvDimOf, kvShapeOf, type ModelConfig, qDimOf, type RopeScaling, validateConfig } from "./config.ts";
export { LoadProgress } from "./load-progress.ts";
export { type FileBytes, mapFile, mapFileBytes, MAX_MAPPING } from "./mapped-file.ts";
export { type DType, DTYPES, type Matrix, matrixBytes, type PackedMatrix, type SimpleMatrix } from "./packed.ts";
export { type KvPoolSize, type KvSlab, type SeqChunk, Transformer } from "./transformer.ts";
export { castWeights, type DenseWeightName, holdWeights, syntheticWeights, validateWeights, type Weights, weightsBytes, weightSizes } from "./weights.ts";
