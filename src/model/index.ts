export {
  type ModelConfig,
  DEFAULT_NORM_EPS,
  DEFAULT_ROPE_THETA,
  headDimOf,
  kvDimOf,
  kvShapeOf,
  validateConfig,
} from "./compute/config.ts";
export {
  type Weights,
  type SyntheticOptions,
  castWeights,
  syntheticWeights,
  validateWeights,
  weightSizes,
  weightsBytes,
  weightsDType,
} from "./compute/weights.ts";
export { type DType, type Matrix, type PackedMatrix, DTYPES, castMatrix, dequantize } from "./compute/packed.ts";
export { type KvSlab, type SeqChunk, Transformer } from "./compute/transformer.ts";
export { dropFirst } from "./thread/drop-first.ts";
export { type EncodeOptions, type Tokenizer, ByteTokenizer, StreamDecoder } from "../tokenizer/tokenizer.ts";
export type { TokenizerSource, GgufTokenizerMeta } from "../tokenizer/tokenizer-source.ts";
export { type BuiltTokenizer, buildTokenizer } from "../tokenizer/build-tokenizer.ts";
export { HfTokenizer } from "../tokenizer/hf-tokenizer.ts";
export { tokenizerFingerprint } from "../tokenizer/tokenizer-fingerprint.ts";
export {
  type ChatMessage,
  type ChatRenderer,
  type RenderOptions,
  ChatTemplate,
  ChatTemplateError,
  DEFAULT_CHAT_TEMPLATE,
  chatRenderer,
  chatRendererFor,
} from "../tokenizer/chat-template.ts";
export { type LoadedModel, SYNTHETIC_CONFIG, SYNTHETIC_MODEL_NAME, loadSyntheticModel } from "./load/synthetic.ts";
export { DEFAULT_MODEL_NAME, defaultModelDir } from "./load/default-model.ts";
export { type Llama2cModel, encodeLlama2cCheckpoint, loadLlama2cCheckpoint, parseLlama2cCheckpoint, writeLlama2cCheckpoint } from "./load/llama2c.ts";
export {
  type VocabEntry,
  Llama2cTokenizer,
  encodeLlama2cTokenizer,
  loadLlama2cTokenizer,
  parseLlama2cTokenizer,
  writeLlama2cTokenizer,
} from "../tokenizer/llama2c-tokenizer.ts";
export { type RopeScaling, qDimOf, ropeFrequencies } from "./compute/config.ts";
export { type RawDtype, type RawTensor, DTYPE_BLOCK, toFloat32 } from "./load/raw-tensor.ts";
export { MAX_SAFETENSORS_HEADER, parseSafetensors } from "./load/safetensors.ts";
export { type GgufFile, type GgufTensorInfo, type GgufValue, GGUF_MAGIC, ggmlTypeName, parseGguf } from "./load/gguf.ts";
export { interleavedToSplitHalf, splitHalfToInterleaved } from "./load/rope-order.ts";
export { type ModelSpec, UnsupportedModelError } from "./load/model-spec.ts";
export { hfModelSpec } from "./load/hf-config.ts";
export { ggufModelSpec } from "./load/gguf-config.ts";
export { type TensorSource, type WeightStats, assembleWeights, GGUF_NAMING, HF_NAMING } from "./load/assemble-weights.ts";
export { type ModelFormat, ModelFormatError, SUPPORTED_FORMATS, detectModelFormat } from "./load/model-format.ts";
export { LoadProgress } from "./compute/load-progress.ts";
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
} from "./load/load-model.ts";
export { holdWeights } from "./thread/held-weights.ts";
export { LogitsRows } from "./thread/logits-rows.ts";
export { grammarVocab } from "../tokenizer/grammar-vocab.ts";
export { type ForwardDone, ModelWorker, type ModelThreadCounters } from "./thread/model-worker.ts";
export { prevToken, SAMPLE_FAILED } from "./thread/model-worker-protocol.ts";
export type { LoadedInfo, ModelThreadOptions, RowSampling } from "./thread/model-worker-protocol.ts";
