// src/model/load: model files in, a ModelSpec and placed-ready weights out. What other rooms use.
export type { WeightStats } from "./assemble-weights.ts";
export { loadLlama2cCheckpoint } from "./llama2c.ts";
export { loadModel, type LoadModelOptions, loadTokenizerFor, readModelFilesFor, type ServableModel, servingEosIds } from "./load-model.ts";
export { loadSyntheticModel, SYNTHETIC_MODEL_NAME } from "./synthetic.ts";
