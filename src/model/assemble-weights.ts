import { headDimOf, kvDimOf, qDimOf } from "./config.ts";
import type { ModelSpec } from "./model-spec.ts";
import { elementCount, type RawTensor, toFloat32 } from "./raw-tensor.ts";
import { splitHalfToInterleaved } from "./rope-order.ts";
import { type DenseWeightName, validateWeights, type Weights } from "./weights.ts";

/** Where named tensors come from (one safetensors file, several shards, a GGUF file). */
export interface TensorSource {
  names(): Iterable<string>;
  /** The tensor's dtype/shape/bytes view, or undefined when absent; throws when present but unreadable. */
  get(name: string): RawTensor | undefined;
}

/** A file format's tensor names: the global ones and each per-layer tensor's suffix after `layerPrefix(l)`. */
export interface TensorNaming {
  embed: string;
  finalNorm: string;
  classifier: string;
  layerPrefix(l: number): string;
  layer: Readonly<Record<LayerField, string>>;
  /** Tensors a loader may leave unused without changing the model (e.g. cached inv_freq). */
  ignorable(name: string): boolean;
}

type LayerField = "rmsAtt" | "wq" | "wk" | "wv" | "wo" | "rmsFfn" | "w1" | "w2" | "w3" | "bq" | "bk" | "bv";

export const HF_NAMING: TensorNaming = {
  embed: "model.embed_tokens.weight",
  finalNorm: "model.norm.weight",
  classifier: "lm_head.weight",
  layerPrefix: (l) => `model.layers.${l}.`,
  layer: {
    rmsAtt: "input_layernorm.weight",
    wq: "self_attn.q_proj.weight",
    wk: "self_attn.k_proj.weight",
    wv: "self_attn.v_proj.weight",
    wo: "self_attn.o_proj.weight",
    rmsFfn: "post_attention_layernorm.weight",
    w1: "mlp.gate_proj.weight",
    w2: "mlp.down_proj.weight",
    w3: "mlp.up_proj.weight",
    bq: "self_attn.q_proj.bias",
    bk: "self_attn.k_proj.bias",
    bv: "self_attn.v_proj.bias",
  },
  ignorable: (n) => n.endsWith(".rotary_emb.inv_freq"),
};

export const GGUF_NAMING: TensorNaming = {
  embed: "token_embd.weight",
  finalNorm: "output_norm.weight",
  classifier: "output.weight",
  layerPrefix: (l) => `blk.${l}.`,
  layer: {
    rmsAtt: "attn_norm.weight",
    wq: "attn_q.weight",
    wk: "attn_k.weight",
    wv: "attn_v.weight",
    wo: "attn_output.weight",
    rmsFfn: "ffn_norm.weight",
    w1: "ffn_gate.weight",
    w2: "ffn_down.weight",
    w3: "ffn_up.weight",
    bq: "attn_q.bias",
    bk: "attn_k.bias",
    bv: "attn_v.bias",
  },
  // The llama3 frequency table, read into the spec's ropeScaling.
  ignorable: (n) => n === "rope_freqs.weight",
};

export interface WeightStats {
  /** Elements of every distinct tensor the model uses (a tied classifier counted once). */
  parameters: number;
  /** The stored dtypes, e.g. "bf16" or "q8_0+f32". */
  dtype: string;
  /** Bytes the weights take as this engine holds them (f32). */
  residentBytes: number;
}

/**
 * Builds the transformer's Weights from a file's tensors: checks every shape against the spec,
 * converts to f32 (toFloat32, the one conversion), stacks layers, reorders q/k rows into the
 * interleaved RoPE order when the file uses split halves, and refuses tensors the model would
 * silently ignore (an o_proj bias, extra experts...). `onBytes` is told the stored bytes of
 * each tensor once it is converted, for a progress line.
 */
export function assembleWeights(
  spec: ModelSpec,
  src: TensorSource,
  naming: TensorNaming,
  onBytes: (n: number) => void = () => {},
): { weights: Weights; stats: WeightStats } {
  const { cfg } = spec;
  const { dim, hiddenDim: hid, nLayers: L, vocabSize: V } = cfg;
  const qDim = qDimOf(cfg);
  const kvDim = kvDimOf(cfg);
  const used = new Set<string>();
  const dtypes = new Set<string>();
  let parameters = 0;
  const take = (name: string, shape: readonly number[], permuteRows = false): Float32Array => {
    const t = src.get(name);
    if (t === undefined) throw new Error(`${cfg.name}: tensor ${name} is missing`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new Error(`${cfg.name}: tensor ${name} has shape ${JSON.stringify(t.shape)}, want ${JSON.stringify(shape)}`);
    }
    used.add(name);
    dtypes.add(t.dtype);
    parameters += elementCount(shape);
    let v = toFloat32(t);
    if (permuteRows && spec.ropeOrder === "split-half") v = splitHalfToInterleaved(v, shape[0]! / headDimOf(cfg), headDimOf(cfg), shape[1] ?? 1);
    onBytes(t.bytes.length);
    return v;
  };
  const stacked = (field: LayerField, shape: readonly number[], permuteRows = false): Float32Array => {
    const per = elementCount(shape);
    const out = new Float32Array(L * per);
    for (let l = 0; l < L; l++) out.set(take(naming.layerPrefix(l) + naming.layer[field], shape, permuteRows), l * per);
    return out;
  };
  const tokenEmbedding = take(naming.embed, [V, dim]);
  const w: Weights = {
    tokenEmbedding,
    rmsAtt: stacked("rmsAtt", [dim]),
    wq: stacked("wq", [qDim, dim], true),
    wk: stacked("wk", [kvDim, dim], true),
    wv: stacked("wv", [kvDim, dim]),
    wo: stacked("wo", [dim, qDim]),
    rmsFfn: stacked("rmsFfn", [dim]),
    w1: stacked("w1", [hid, dim]),
    w2: stacked("w2", [dim, hid]),
    w3: stacked("w3", [hid, dim]),
    rmsFinal: take(naming.finalNorm, [dim]),
    wcls: tokenEmbedding,
  };
  if (!spec.tied) w.wcls = take(naming.classifier, [V, dim]);
  if (spec.biases) {
    w.bq = stacked("bq", [qDim], true);
    w.bk = stacked("bk", [kvDim], true);
    w.bv = stacked("bv", [kvDim]);
  }
  refuseUnused(src, used, naming, spec, cfg.name);
  validateWeights(cfg, w);
  return { weights: w, stats: { parameters, dtype: [...dtypes].sort().join("+"), residentBytes: residentBytesOf(w) } };
}

function refuseUnused(src: TensorSource, used: ReadonlySet<string>, naming: TensorNaming, spec: ModelSpec, model: string): void {
  const extra: string[] = [];
  for (const n of src.names()) {
    // A tied model's file may still hold a copy of the classifier; transformers ignores it too.
    if (used.has(n) || naming.ignorable(n) || (spec.tied && n === naming.classifier)) continue;
    extra.push(n);
  }
  if (extra.length > 0) {
    const more = extra.length > 3 ? ` and ${extra.length - 3} more` : "";
    throw new Error(
      `${model}: tensors ${extra.slice(0, 3).join(", ")}${more} are not used by this architecture (an unsupported option, e.g. o_proj bias or experts): refusing rather than ignoring them`,
    );
  }
}

/** Bytes of every distinct weight array. */
export function residentBytesOf(w: Weights): number {
  const seen = new Set<Float32Array>();
  let n = 0;
  for (const k of Object.keys(w) as (DenseWeightName | "bq" | "bk" | "bv")[]) {
    const a = w[k];
    if (a && !seen.has(a)) {
      seen.add(a);
      n += a.byteLength;
    }
  }
  return n;
}
