import { DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, type ModelConfig, validateConfig } from "../compute/index.ts";
import type { GgufValue } from "./gguf.ts";
import { idList } from "./hf-config.ts";
import { type ModelSpec, UnsupportedModelError } from "./model-spec.ts";
import { quote } from "../../codec/index.ts";

/**
 * general.architecture -> the row order its q/k weights are stored in. llama.cpp's converter
 * permutes HF Llama weights back to Meta's interleaved order (its "normal" rope); qwen2 uses
 * NEOX rope, i.e. HF's split-half order, so those are permuted here as HF folders are.
 */
const GGUF_ARCHS: Readonly<Record<string, ModelSpec["ropeOrder"]>> = { llama: "interleaved", qwen2: "split-half" };

/** What the file's tensors say that the metadata may not: tie, biases, the llama3 rope table. */
export interface GgufTensorFacts {
  hasOutput: boolean;
  hasQBias: boolean;
  vocabRows: number | null;
  ropeFactors: Float32Array | null;
}

/** The spec of a GGUF file from its `general.architecture` and `<arch>.*` keys; unimplemented options refused by key. */
export function ggufModelSpec(meta: ReadonlyMap<string, GgufValue>, facts: GgufTensorFacts, name: string, maxSeqLen = Infinity): ModelSpec {
  const refuse = (what: string) => new UnsupportedModelError(`${name}: GGUF ${what}`);
  const arch = meta.get("general.architecture");
  if (typeof arch !== "string" || !(arch in GGUF_ARCHS))
    throw refuse(`general.architecture ${quote(arch)} is not supported (supported: ${Object.keys(GGUF_ARCHS).join(", ")})`);
  const get = (k: string) => meta.get(`${arch}.${k}`);
  const int = (k: string, dflt?: number): number => {
    const v = get(k) ?? dflt;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1) throw new Error(`${name}: GGUF ${arch}.${k} = ${quote(get(k))}: want a positive integer`);
    return v;
  };
  const num = (k: string, dflt: number): number => {
    const v = get(k) ?? dflt;
    if (typeof v !== "number" || !(v > 0)) throw new Error(`${name}: GGUF ${arch}.${k} = ${quote(get(k))}: want a positive number`);
    return v;
  };
  const experts = get("expert_count");
  if (experts !== undefined && experts !== 0) throw refuse(`${arch}.expert_count = ${String(experts)}: mixture-of-experts models are not supported`);
  const ctx = int("context_length");
  const window = get("attention.sliding_window");
  if (window !== undefined && !(typeof window === "number" && window >= ctx))
    throw refuse(`${arch}.attention.sliding_window = ${String(window)} is not supported (sliding-window attention)`);
  const scaling = get("rope.scaling.type");
  if (scaling !== undefined && scaling !== "none") throw refuse(`${arch}.rope.scaling.type ${quote(scaling)} is not supported`);
  const dim = int("embedding_length");
  const nHeads = int("attention.head_count");
  const tokens = meta.get("tokenizer.ggml.tokens");
  const vocab = get("vocab_size") ?? facts.vocabRows ?? (Array.isArray(tokens) ? tokens.length : undefined);
  const headDim = get("attention.key_length") === undefined ? dim / nHeads : int("attention.key_length");
  const vDim = get("attention.value_length") === undefined ? headDim : int("attention.value_length");
  if (vDim !== headDim) throw refuse(`${arch}.attention.value_length ${vDim} != key_length ${headDim} is not supported`);
  const ropeDims = get("rope.dimension_count") === undefined ? headDim : int("rope.dimension_count");
  if (ropeDims !== headDim) throw refuse(`${arch}.rope.dimension_count ${ropeDims} (partial RoPE over a head of ${headDim}) is not supported`);
  const cfg: ModelConfig = {
    name,
    dim,
    hiddenDim: int("feed_forward_length"),
    nLayers: int("block_count"),
    nHeads,
    nKvHeads: int("attention.head_count_kv", nHeads),
    vocabSize: typeof vocab === "number" ? vocab : 0,
    maxSeqLen: Math.min(ctx, maxSeqLen),
    ropeTheta: num("rope.freq_base", DEFAULT_ROPE_THETA),
    normEps: num("attention.layer_norm_rms_epsilon", DEFAULT_NORM_EPS),
  };
  if (headDim * nHeads !== dim) cfg.headDim = headDim;
  if (facts.ropeFactors) cfg.ropeScaling = { type: "factors", factors: Array.from(facts.ropeFactors) };
  validateConfig(cfg);
  const eosIds = idList([meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id"), meta.get("tokenizer.ggml.eom_token_id")]);
  const bos = meta.get("tokenizer.ggml.bos_token_id");
  return {
    cfg,
    tied: !facts.hasOutput,
    biases: facts.hasQBias,
    ropeOrder: GGUF_ARCHS[arch]!,
    eosIds: [...new Set(eosIds)],
    bosId: typeof bos === "number" ? bos : null,
  };
}
