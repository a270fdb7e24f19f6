export {
  type ModelConfig,
  DEFAULT_NORM_EPS,
  DEFAULT_ROPE_THETA,
  headDimOf,
  kvDimOf,
  kvShapeOf,
  validateConfig,
} from "./config.ts";
export { type Weights, type SyntheticOptions, castWeights, syntheticWeights, validateWeights, weightSizes, weightsBytes, weightsDType } from "./weights.ts";
export { type DType, type Matrix, type PackedMatrix, DTYPES, castMatrix, dequantize } from "./packed.ts";
export { type KvSlab, type SeqChunk, Transformer } from "./transformer.ts";
export { dropFirst } from "./drop-first.ts";
export { type EncodeOptions, type Tokenizer, ByteTokenizer, StreamDecoder } from "./tokenizer.ts";
export type { TokenizerSource, GgufTokenizerMeta } from "./tokenizer-source.ts";
export { type BuiltTokenizer, buildTokenizer } from "./build-tokenizer.ts";
export { HfTokenizer } from "./hf-tokenizer.ts";
export { tokenizerFingerprint } from "./tokenizer-fingerprint.ts";
export {
  type ChatMessage,
  type ChatRenderer,
  type RenderOptions,
  ChatTemplate,
  ChatTemplateError,
  DEFAULT_CHAT_TEMPLATE,
  chatRenderer,
  chatRendererFor,
} from "./chat-template.ts";
export { type LoadedModel, SYNTHETIC_CONFIG, SYNTHETIC_MODEL_NAME, loadSyntheticModel } from "./synthetic.ts";
export { DEFAULT_MODEL_NAME, defaultModelDir } from "./default-model.ts";
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
export { type RopeScaling, qDimOf, ropeFrequencies } from "./config.ts";
export { type RawDtype, type RawTensor, DTYPE_BLOCK, toFloat32 } from "./raw-tensor.ts";
export { MAX_SAFETENSORS_HEADER, parseSafetensors } from "./safetensors.ts";
export { type GgufFile, type GgufTensorInfo, type GgufValue, GGUF_MAGIC, ggmlTypeName, parseGguf } from "./gguf.ts";
export { interleavedToSplitHalf, splitHalfToInterleaved } from "./rope-order.ts";
export { type ModelSpec, UnsupportedModelError } from "./model-spec.ts";
export { hfModelSpec } from "./hf-config.ts";
export { ggufModelSpec } from "./gguf-config.ts";
export { type TensorSource, type WeightStats, assembleWeights, GGUF_NAMING, HF_NAMING } from "./assemble-weights.ts";
export { type ModelFormat, ModelFormatError, SUPPORTED_FORMATS, detectModelFormat } from "./model-format.ts";
export { LoadProgress } from "./load-progress.ts";
export {
  type LoadModelOptions,
  type ModelFiles,
  type ModelFilesOptions,
  type ServableModel,
  loadModel,
  loadTokenizerFor,
  modelPathOf,
  readModelFiles,
  readModelFilesFor,
  servingEosIds,
} from "./load-model.ts";
export { holdWeights } from "./held-weights.ts";
export { LogitsRows } from "./logits-rows.ts";
export { grammarVocab } from "./grammar-vocab.ts";
export { type ForwardDone, ModelWorker, type ModelThreadCounters } from "./model-worker.ts";
export { prevToken, SAMPLE_FAILED } from "./model-worker-protocol.ts";
export type { LoadedInfo, ModelThreadOptions, RowSampling } from "./model-worker-protocol.ts";
