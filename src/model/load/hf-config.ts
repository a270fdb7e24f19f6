import { DEFAULT_ROPE_THETA, type ModelConfig, type RopeScaling, validateConfig } from "../compute/index.ts";
import { type ModelSpec, UnsupportedModelError } from "./model-spec.ts";
import { quote } from "../../codec/index.ts";

/** model_type -> the architectures entry transformers writes for it. */
const HF_TYPES: Readonly<Record<string, string>> = { llama: "LlamaForCausalLM", mistral: "MistralForCausalLM", qwen2: "Qwen2ForCausalLM" };

/**
 * The spec of a Hugging Face config.json of the Llama family (llama, mistral, qwen2). Options
 * the transformer does not implement are refused by name rather than ignored: a model that
 * loads is one that runs as its authors trained it. `maxSeqLen` caps max_position_embeddings
 * (the RoPE tables and attention scratch are sized by it).
 */
export function hfModelSpec(json: unknown, name: string, maxSeqLen = Infinity): ModelSpec {
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new Error(`${name}: config.json is not a JSON object`);
  const c = json as Record<string, unknown>;
  const refuse = (what: string) => new UnsupportedModelError(`${name}: config.json ${what}`);
  const type = c.model_type;
  if (typeof type !== "string" || !(type in HF_TYPES))
    throw refuse(`model_type ${quote(type)} is not supported (supported: ${Object.keys(HF_TYPES).join(", ")})`);
  const archs = c.architectures;
  if (archs !== undefined && (!Array.isArray(archs) || archs.length !== 1 || archs[0] !== HF_TYPES[type])) {
    throw refuse(`architectures ${quote(archs)} is not supported for model_type ${type} (want ["${HF_TYPES[type]}"])`);
  }
  for (const k of ["num_experts", "num_local_experts", "n_routed_experts"]) {
    if (c[k] !== undefined && c[k] !== null && c[k] !== 0) throw refuse(`${k} = ${quote(c[k])}: mixture-of-experts models are not supported`);
  }
  if (c.hidden_act !== undefined && c.hidden_act !== "silu") throw refuse(`hidden_act ${quote(c.hidden_act)} is not supported (want "silu")`);
  if (c.attention_bias === true) throw refuse("attention_bias = true (a bias on o_proj too) is not supported");
  if (c.mlp_bias === true) throw refuse("mlp_bias = true is not supported");
  const int = (k: string, dflt?: number): number => {
    const v = c[k] ?? dflt;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1) throw new Error(`${name}: config.json ${k} = ${quote(c[k])}: want a positive integer`);
    return v;
  };
  const num = (k: string, dflt: number): number => {
    const v = c[k] ?? dflt;
    if (typeof v !== "number" || !(v > 0)) throw new Error(`${name}: config.json ${k} = ${quote(c[k])}: want a positive number`);
    return v;
  };
  const dim = int("hidden_size");
  const nHeads = int("num_attention_heads");
  const maxPos = int("max_position_embeddings");
  slidingWindow(c, type, maxPos, refuse);
  const headDim = c.head_dim === undefined || c.head_dim === null ? undefined : int("head_dim");
  const cfg: ModelConfig = {
    name,
    dim,
    hiddenDim: int("intermediate_size"),
    nLayers: int("num_hidden_layers"),
    nHeads,
    nKvHeads: int("num_key_value_heads", nHeads),
    vocabSize: int("vocab_size"),
    maxSeqLen: Math.min(maxPos, maxSeqLen),
    ropeTheta: num("rope_theta", DEFAULT_ROPE_THETA),
    normEps: num("rms_norm_eps", 1e-6),
  };
  if (headDim !== undefined && headDim * nHeads !== dim) cfg.headDim = headDim;
  const scaling = ropeScaling(c.rope_scaling, refuse);
  if (scaling) cfg.ropeScaling = scaling;
  validateConfig(cfg);
  const tie = c.tie_word_embeddings ?? false;
  if (typeof tie !== "boolean") throw new Error(`${name}: config.json tie_word_embeddings = ${quote(tie)}: want a boolean`);
  return {
    cfg,
    tied: tie,
    biases: type === "qwen2",
    ropeOrder: "split-half",
    eosIds: idList(c.eos_token_id),
    bosId: typeof c.bos_token_id === "number" ? c.bos_token_id : null,
  };
}

/** Refuses a sliding window that would change attention within the context we serve. */
function slidingWindow(c: Record<string, unknown>, type: string, maxPos: number, refuse: (what: string) => Error): void {
  const w = c.sliding_window;
  if (w === undefined || w === null) return;
  // Qwen2 configs always carry sliding_window; it acts only with use_sliding_window.
  if (type === "qwen2" && c.use_sliding_window !== true) return;
  if (typeof w === "number" && w >= maxPos) return;
  throw refuse(`sliding_window = ${quote(w)} is not supported (sliding-window attention; only windows >= max_position_embeddings ${maxPos} load)`);
}

function ropeScaling(s: unknown, refuse: (what: string) => Error): RopeScaling | null {
  if (s === undefined || s === null) return null;
  if (typeof s !== "object") throw refuse(`rope_scaling ${quote(s)} is not an object`);
  const r = s as Record<string, unknown>;
  const type = r.rope_type ?? r.type;
  if (type === "default") return null;
  if (type !== "llama3") throw refuse(`rope_scaling type ${quote(type)} is not supported (supported: llama3, default)`);
  const n = (k: string): number => {
    if (typeof r[k] !== "number") throw refuse(`rope_scaling ${k} = ${quote(r[k])}: want a number`);
    return r[k] as number;
  };
  return {
    type: "llama3",
    factor: n("factor"),
    lowFreqFactor: n("low_freq_factor"),
    highFreqFactor: n("high_freq_factor"),
    originalMaxPositions: n("original_max_position_embeddings"),
  };
}

/** An id or a list of ids (eos_token_id is either), as a list of valid ids. */
export function idList(v: unknown): number[] {
  const list = Array.isArray(v) ? v : v === undefined || v === null ? [] : [v];
  return list.filter((x): x is number => Number.isSafeInteger(x) && (x as number) >= 0);
}
