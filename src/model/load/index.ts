// src/model/load: model files in, a ModelSpec, weights and a tokenizer source out. What other rooms use.
export type { WeightStats } from "./assemble-weights.ts";
export { loadLlama2cCheckpoint } from "./llama2c.ts";
export { loadModel, type LoadModelOptions, loadTokenizerFor, readModelFilesFor, type ServableModel, servingEosIds } from "./load-model.ts";
export { loadSyntheticModel, SYNTHETIC_MODEL_NAME } from "./synthetic.ts";
