import {
  headDimOf,
  kvDimOf,
  qDimOf,
  DTYPES,
  type DType,
  type Matrix,
  matrixBytes,
  type PackedMatrix,
  type SimpleMatrix,
  type DenseWeightName,
  validateWeights,
  type Weights,
  weightsBytes,
} from "../compute/index.ts";
import type { ModelSpec } from "./model-spec.ts";
import { byteLengthOf, elementCount, type RawTensor, toFloat32 } from "./raw-tensor.ts";
import { splitHalfToInterleaved, splitHalfToInterleavedBytes } from "./rope-order.ts";
import { quote } from "../../codec/index.ts";

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
  /** Bytes the weights take as this engine holds them (f32, or packed as loaded). */
  residentBytes: number;
  /** Stored matrix dtypes made f32 at load because no kernel reads them as stored (e.g. q4_0), or none. */
  widened?: readonly string[];
}

/**
 * Builds the transformer's Weights from a file's tensors: checks every shape against the spec,
 * stacks layers, reorders q/k rows into the interleaved RoPE order when the file uses split
 * halves, and refuses tensors the model would silently ignore (an o_proj bias, extra experts...).
 * A matrix stored in `dtype` (any packed DType; "as-stored": whatever packed dtype it is stored
 * in, each matrix its own, a weight's layers of different dtypes stacked in parts) is kept
 * packed, straight from the file's bytes with rows moved whole; everything else goes through
 * toFloat32, the one conversion. `onBytes` is told the
 * stored bytes of each tensor once it is taken, for a progress line.
 */
// Long by design: the weight table below reads as the model's tensor list, and the small
// closures above it share one shape check, one used-set and one dtype decision.
export function assembleWeights(
  spec: ModelSpec,
  src: TensorSource,
  naming: TensorNaming,
  onBytes: (n: number) => void = () => {},
  dtype: DType | "as-stored" = "f32",
): { weights: Weights<Matrix>; stats: WeightStats } {
  const { cfg } = spec;
  const { dim, hiddenDim: hid, nLayers: L, vocabSize: V } = cfg;
  const qDim = qDimOf(cfg);
  const kvDim = kvDimOf(cfg);
  const hd = headDimOf(cfg);
  const keep = packedTarget(dtype);
  const used = new Set<string>();
  const dtypes = new Set<string>();
  const widened = new Set<string>();
  let parameters = 0;
  const raw = (name: string, shape: readonly number[]): RawTensor => {
    const t = src.get(name);
    if (t === undefined) throw new Error(`${cfg.name}: tensor ${name} is missing`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new Error(`${cfg.name}: tensor ${name} has shape ${quote(t.shape)}, want ${quote(shape)}`);
    }
    used.add(name);
    dtypes.add(t.dtype);
    parameters += elementCount(shape);
    onBytes(t.bytes.length);
    return t;
  };
  const permuted = (permuteRows: boolean) => permuteRows && spec.ropeOrder === "split-half";
  const take = (name: string, shape: readonly number[], permuteRows = false): Float32Array => {
    const v = toFloat32(raw(name, shape));
    return permuted(permuteRows) ? splitHalfToInterleaved(v, shape[0]! / hd, hd, shape[1] ?? 1) : v;
  };
  const takeMatrix = (name: string, shape: readonly [number, number], permuteRows = false): SimpleMatrix => {
    const t = raw(name, shape);
    const dt = t.dtype;
    if (!keep(dt)) {
      if (dt !== "f32") widened.add(dt);
      const v = toFloat32(t);
      return permuted(permuteRows) ? splitHalfToInterleaved(v, shape[0] / hd, hd, shape[1]) : v;
    }
    const stored = packedBytesOf(t, cfg.name);
    const bytes = permuted(permuteRows) ? splitHalfToInterleavedBytes(stored, shape[0] / hd, hd, matrixBytes(dt, shape[1])) : t.bytes;
    return { dtype: dt, cols: shape[1], length: shape[0] * shape[1], bytes };
  };
  const stacked = (field: LayerField, shape: readonly number[], permuteRows = false): Float32Array => {
    const per = elementCount(shape);
    const out = new Float32Array(L * per);
    for (let l = 0; l < L; l++) out.set(take(naming.layerPrefix(l) + naming.layer[field], shape, permuteRows), l * per);
    return out;
  };
  const stackedMatrix = (field: LayerField, shape: readonly [number, number], permuteRows = false): Matrix => {
    const layers = Array.from({ length: L }, (_, l) => takeMatrix(naming.layerPrefix(l) + naming.layer[field], shape, permuteRows));
    return stackLayers(layers, shape[1]);
  };
  const tokenEmbedding = takeMatrix(naming.embed, [V, dim]);
  const w: Weights<Matrix> = {
    tokenEmbedding,
    rmsAtt: stacked("rmsAtt", [dim]),
    wq: stackedMatrix("wq", [qDim, dim], true),
    wk: stackedMatrix("wk", [kvDim, dim], true),
    wv: stackedMatrix("wv", [kvDim, dim]),
    wo: stackedMatrix("wo", [dim, qDim]),
    rmsFfn: stacked("rmsFfn", [dim]),
    w1: stackedMatrix("w1", [hid, dim]),
    w2: stackedMatrix("w2", [dim, hid]),
    w3: stackedMatrix("w3", [hid, dim]),
    rmsFinal: take(naming.finalNorm, [dim]),
    wcls: tokenEmbedding,
  };
  if (!spec.tied) w.wcls = takeMatrix(naming.classifier, [V, dim]);
  if (spec.biases) {
    w.bq = stacked("bq", [qDim], true);
    w.bk = stacked("bk", [kvDim], true);
    w.bv = stacked("bv", [kvDim]);
  }
  refuseUnused(src, used, naming, spec, cfg.name);
  validateWeights(cfg, w);
  return {
    weights: w,
    stats: { parameters, dtype: [...dtypes].sort().join("+"), residentBytes: weightsBytes(w), ...(widened.size > 0 ? { widened: [...widened].sort() } : {}) },
  };
}

/**
 * Whether a matrix stored in a dtype is kept as stored: every dtype the kernels read (DTYPES:
 * every GGUF type this engine reads), each its own, unless f32 is asked for. A matrix kept for
 * another packed dtype is converted by castWeights layer by layer, where widening it whole first
 * took a 1B F16 model to ~9 GB and minutes (`--dtype q8_0`); every other matrix becomes f32
 * first (`widened` says so).
 */
function packedTarget(dtype: DType | "as-stored"): (stored: string) => stored is PackedMatrix["dtype"] {
  if (dtype === "f32") return (_d): _d is PackedMatrix["dtype"] => false;
  return (d): d is PackedMatrix["dtype"] => d !== "f32" && (DTYPES as readonly string[]).includes(d);
}

/**
 * A tensor kept packed: its byte length checked, its bytes a view of the file, copied only when
 * at an odd offset (packed matrices are read through 16-bit views).
 */
function packedBytesOf(t: RawTensor, model: string): Uint8Array {
  const want = byteLengthOf(t.dtype, elementCount(t.shape), t.name);
  if (t.bytes.length !== want) throw new Error(`${model}: tensor ${t.name}: ${t.bytes.length} bytes, want ${want} for ${t.dtype} ${quote(t.shape)}`);
  return t.bytes.byteOffset % 2 === 0 ? t.bytes : t.bytes.slice();
}

/** Layers stacked along a leading axis: packed when every layer is (bytes concatenated), else f32. */
function stackLayers(layers: SimpleMatrix[], cols: number): Matrix {
  // f32 layers (widened, or stored so) are one array; packed layers stay where they are, one
  // part each (views of the file, or the permuted copies): placing the matrix reads them part
  // by part, so a model is never held twice while it loads, and a layer group takes its own.
  if (layers.every((m) => m instanceof Float32Array)) return concatLayers(layers);
  if (layers.length === 1) return layers[0]!;
  return { dtype: "stacked", cols, length: layers.reduce((t, p) => t + p.length, 0), parts: layers };
}

/** Layers of one dtype as one matrix: their bytes (or values) back to back. */
function concatLayers(layers: SimpleMatrix[]): Float32Array {
  const per = layers[0]!.length;
  const out = new Float32Array(per * layers.length);
  layers.forEach((m, l) => out.set(m as Float32Array, l * per));
  return out;
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
