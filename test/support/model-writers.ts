import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { headDimOf, kvDimOf, qDimOf } from "../../src/model/compute/config.ts";
import { interleavedToSplitHalf } from "../../src/model/load/rope-order.ts";
import type { ModelConfig } from "../../src/model/index.ts";
import type { Weights } from "../../src/model/compute/weights.ts";
import { quantizeQ5K, quantizeQ6K } from "../../src/model/compute/k-quants.ts";

// Writers of the model formats the loaders read, from a Weights object (run.c layout, interleaved
// RoPE order). They write what the real tools write: HF's split-half q/k order, GGUF's reversed
// dims and aligned data section, so the loaders' reorder and bounds logic is exercised.

export type StDtype = "F32" | "F16" | "BF16";
export interface NamedTensor {
  name: string;
  shape: number[];
  data: Float32Array;
}

/** f32 -> bf16 bits, round to nearest even (as torch does). */
export function bf16Bits(x: number): number {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0]!;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

function encodeValues(data: Float32Array, dtype: StDtype | "f32" | "f16" | "bf16"): Uint8Array {
  const d = dtype.toLowerCase();
  if (d === "f32") return new Uint8Array(data.slice().buffer);
  if (d === "f16") return new Uint8Array(new Float16Array(data).buffer);
  const out = new Uint16Array(data.length);
  for (let i = 0; i < data.length; i++) out[i] = bf16Bits(data[i]!);
  return new Uint8Array(out.buffer);
}

export function encodeSafetensors(tensors: readonly NamedTensor[], dtype: StDtype): Uint8Array {
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  const blobs: Uint8Array[] = [];
  let at = 0;
  for (const t of tensors) {
    const b = encodeValues(t.data, dtype);
    header[t.name] = { dtype, shape: t.shape, data_offsets: [at, at + b.length] };
    blobs.push(b);
    at += b.length;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((json.length + 8) % 8)) % 8);
  const hb = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + hb.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(hb.length), true);
  out.set(hb, 8);
  let o = 8 + hb.length;
  for (const b of blobs) {
    out.set(b, o);
    o += b.length;
  }
  return out;
}

interface LayerNames {
  embed: string;
  norm: string;
  cls: string;
  layer: (l: number, field: string) => string;
  fields: Record<string, string>;
}

const HF: LayerNames = {
  embed: "model.embed_tokens.weight",
  norm: "model.norm.weight",
  cls: "lm_head.weight",
  layer: (l, f) => `model.layers.${l}.${f}`,
  fields: {
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
};
const GG: LayerNames = {
  embed: "token_embd.weight",
  norm: "output_norm.weight",
  cls: "output.weight",
  layer: (l, f) => `blk.${l}.${f}`,
  fields: {
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
};

/**
 * The model's tensors under a format's names, outermost dim first. `splitHalf` writes q/k rows
 * (and biases) in HF's rotate_half order, as HF checkpoints and GGUF NEOX-rope files hold them.
 */
export function namedTensors(cfg: ModelConfig, w: Weights, names: "hf" | "gguf", opts: { tied: boolean; splitHalf: boolean }): NamedTensor[] {
  const n = names === "hf" ? HF : GG;
  const { dim, hiddenDim: hid, nLayers: L, vocabSize: V, nHeads, nKvHeads } = cfg;
  const hd = headDimOf(cfg);
  const qDim = qDimOf(cfg);
  const kvDim = kvDimOf(cfg);
  const shapes: Record<string, number[]> = {
    rmsAtt: [dim],
    wq: [qDim, dim],
    wk: [kvDim, dim],
    wv: [kvDim, dim],
    wo: [dim, qDim],
    rmsFfn: [dim],
    w1: [hid, dim],
    w2: [dim, hid],
    w3: [hid, dim],
    bq: [qDim],
    bk: [kvDim],
    bv: [kvDim],
  };
  const out: NamedTensor[] = [{ name: n.embed, shape: [V, dim], data: w.tokenEmbedding }];
  for (let l = 0; l < L; l++) {
    for (const f of Object.keys(shapes)) {
      const all = w[f as keyof Weights];
      if (!all) continue;
      const shape = shapes[f]!;
      const per = shape.reduce((a, b) => a * b, 1);
      let data: Float32Array = all.slice(l * per, (l + 1) * per);
      const heads = f === "wq" || f === "bq" ? nHeads : f === "wk" || f === "bk" ? nKvHeads : 0;
      if (opts.splitHalf && heads > 0) data = interleavedToSplitHalf(data, heads, hd, shape[1] ?? 1);
      out.push({ name: n.layer(l, n.fields[f]!), shape, data });
    }
  }
  out.push({ name: n.norm, shape: [dim], data: w.rmsFinal });
  if (!opts.tied) out.push({ name: n.cls, shape: [V, dim], data: w.wcls });
  return out;
}

/** A minimal valid byte-level BPE tokenizer.json (its content is never decoded by these tests). */
export const TINY_TOKENIZER_JSON = {
  version: "1.0",
  added_tokens: [{ id: 0, content: "<s>", special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE",
    dropout: null,
    unk_token: null,
    continuing_subword_prefix: null,
    end_of_word_suffix: null,
    fuse_unk: false,
    byte_fallback: false,
    vocab: { "<s>": 0, a: 1, b: 2, ab: 3 },
    merges: ["a b"],
  },
};

export interface HfFolderOptions {
  dtype?: StDtype;
  modelType?: "llama" | "qwen2" | "mistral";
  tied?: boolean;
  /** Split the tensors over this many shards with an index. */
  shards?: number;
  /** Merged over the generated config.json (undefined values delete keys). */
  config?: Record<string, unknown>;
}

export function hfConfigJson(cfg: ModelConfig, o: HfFolderOptions = {}): Record<string, unknown> {
  const type = o.modelType ?? "llama";
  const arch = { llama: "LlamaForCausalLM", qwen2: "Qwen2ForCausalLM", mistral: "MistralForCausalLM" }[type];
  const c: Record<string, unknown> = {
    architectures: [arch],
    model_type: type,
    hidden_size: cfg.dim,
    intermediate_size: cfg.hiddenDim,
    num_hidden_layers: cfg.nLayers,
    num_attention_heads: cfg.nHeads,
    num_key_value_heads: cfg.nKvHeads,
    vocab_size: cfg.vocabSize,
    max_position_embeddings: cfg.maxSeqLen,
    rope_theta: cfg.ropeTheta,
    rms_norm_eps: cfg.normEps,
    hidden_act: "silu",
    tie_word_embeddings: o.tied ?? false,
    torch_dtype: "float32",
    bos_token_id: 1,
    eos_token_id: 2,
  };
  if (cfg.headDim !== undefined) c.head_dim = cfg.headDim;
  if (type === "qwen2") Object.assign(c, { sliding_window: 4096, use_sliding_window: false });
  for (const [k, v] of Object.entries(o.config ?? {}))
    if (v === undefined) delete c[k];
    else c[k] = v;
  return c;
}

/** Writes config.json, tokenizer files and the weights as HF's converter would (split-half q/k). */
export function writeHfFolder(dir: string, cfg: ModelConfig, w: Weights, o: HfFolderOptions = {}): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify(hfConfigJson(cfg, o)));
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(TINY_TOKENIZER_JSON));
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({ bos_token: "<s>", eos_token: "<s>", add_bos_token: true, chat_template: "{{ messages }}" }),
  );
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [2, 3], bos_token_id: 1 }));
  const tensors = namedTensors(cfg, w, "hf", { tied: o.tied ?? false, splitHalf: true });
  const dtype = o.dtype ?? "F32";
  const shards = o.shards ?? 1;
  if (shards === 1) {
    writeFileSync(join(dir, "model.safetensors"), encodeSafetensors(tensors, dtype));
    return;
  }
  const weightMap: Record<string, string> = {};
  const per = Math.ceil(tensors.length / shards);
  for (let s = 0; s < shards; s++) {
    const file = `model-${String(s + 1).padStart(5, "0")}-of-${String(shards).padStart(5, "0")}.safetensors`;
    const part = tensors.slice(s * per, (s + 1) * per);
    for (const t of part) weightMap[t.name] = file;
    writeFileSync(join(dir, file), encodeSafetensors(part, dtype));
  }
  writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: { total_size: 0 }, weight_map: weightMap }));
}

// ---- GGUF ----

export type GgufType = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q4_k" | "q5_k" | "q6_k";
const GGML_TYPE_ID: Record<GgufType, number> = { f32: 0, f16: 1, q4_0: 2, q4_1: 3, q5_0: 6, q5_1: 7, q8_0: 8, q4_k: 12, q5_k: 13, q6_k: 14, bf16: 30 };

/** A metadata entry: [key, gguf value type id, value]; arrays as [key, 9, [elemType, values]]. */
export type GgufKv = [string, number, unknown];
export const GT = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9, u64: 10, i64: 11, f64: 12 } as const;

/** q8_0 as ggml's reference quantizer: d = amax / 127 (stored f16), q = round(x / d). */
export function quantizeQ8_0(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / 32) * 34);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < x.length / 32; b++) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[b * 32 + j]!));
    const d = amax / 127;
    const id = d ? 1 / d : 0;
    dv.setUint16(b * 34, new Uint16Array(new Float16Array([d]).buffer)[0]!, true);
    for (let j = 0; j < 32; j++) dv.setInt8(b * 34 + 2 + j, Math.round(x[b * 32 + j]! * id));
  }
  return out;
}

/** q4_0 as ggml's reference quantizer: d = max / -8 (the signed value of largest magnitude), q = min(15, trunc(x/d + 8.5)). */
export function quantizeQ4_0(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / 32) * 18);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < x.length / 32; b++) {
    let amax = 0;
    let max = 0;
    for (let j = 0; j < 32; j++) {
      const v = x[b * 32 + j]!;
      if (Math.abs(v) > amax) {
        amax = Math.abs(v);
        max = v;
      }
    }
    const d = max / -8;
    const id = d ? 1 / d : 0;
    dv.setUint16(b * 18, new Uint16Array(new Float16Array([d]).buffer)[0]!, true);
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(15, Math.trunc(x[b * 32 + j]! * id + 8.5));
      const q1 = Math.min(15, Math.trunc(x[b * 32 + 16 + j]! * id + 8.5));
      out[b * 18 + 2 + j] = q0 | (q1 << 4);
    }
  }
  return out;
}

const f16Bits = (x: number) => new Uint16Array(new Float16Array([x]).buffer)[0]!;

/**
 * q4_1, q5_0 and q5_1 by ggml's reference recipes: the _1 types d = (max - min) / (2^bits - 1),
 * m = min, q = round((x - m) / d); q5_0 as q4_0 with 16 levels a side: d = max / -16, q =
 * min(31, trunc(x / d + 16.5)). Block: f16 d, [f16 m], [u32 fifth bits], 16 bytes of nibbles.
 */
export function quantizeLegacy(x: Float32Array, type: "q4_1" | "q5_0" | "q5_1"): Uint8Array {
  const min = type !== "q5_0";
  const five = type !== "q4_1";
  const bytes = 18 + (min ? 2 : 0) + (five ? 4 : 0);
  const out = new Uint8Array((x.length / 32) * bytes);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < x.length / 32; b++) {
    const v = x.subarray(b * 32, b * 32 + 32);
    const at = b * bytes;
    let q: number[];
    if (min) {
      const lo = Math.min(...v);
      const hi = Math.max(...v);
      const levels = five ? 31 : 15;
      const d = (hi - lo) / levels;
      const id = d ? 1 / d : 0;
      dv.setUint16(at, f16Bits(d), true);
      dv.setUint16(at + 2, f16Bits(lo), true);
      q = [...v].map((e) => Math.min(levels, Math.round((e - lo) * id)));
    } else {
      let amax = 0;
      let max = 0;
      for (const e of v) if (Math.abs(e) > amax) (amax = Math.abs(e)), (max = e);
      const d = max / -16;
      const id = d ? 1 / d : 0;
      dv.setUint16(at, f16Bits(d), true);
      q = [...v].map((e) => Math.min(31, Math.trunc(e * id + 16.5)));
    }
    const qs = at + 2 + (min ? 2 : 0) + (five ? 4 : 0);
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      out[qs + j] = (q[j]! & 15) | ((q[j + 16]! & 15) << 4);
      qh |= ((q[j]! >> 4) & 1) << j;
      qh |= ((q[j + 16]! >> 4) & 1) << (j + 16);
    }
    if (five) dv.setUint32(qs - 4, qh >>> 0, true);
  }
  return out;
}

/**
 * q4_k, a simple (not ggml's searching) quantizer producing valid blocks: per 32-value
 * sub-block scale = (max - min) / 15 and min = -min(0, lowest); both quantized to 6 bits against
 * the super-block's d and dmin; nibbles rounded.
 */
export function quantizeQ4K(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / 256) * 144);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < x.length / 256; b++) {
    const scales: number[] = [],
      mins: number[] = [];
    for (let j = 0; j < 8; j++) {
      const v = x.subarray(b * 256 + 32 * j, b * 256 + 32 * j + 32);
      const lo = Math.min(0, ...v),
        hi = Math.max(...v);
      scales.push((hi - lo) / 15);
      mins.push(-lo);
    }
    const d = new Float16Array([Math.max(...scales) / 63])[0]!;
    const dmin = new Float16Array([Math.max(...mins) / 63])[0]!;
    const sc = scales.map((s) => (d ? Math.min(63, Math.round(s / d)) : 0));
    const mn = mins.map((m) => (dmin ? Math.min(63, Math.round(m / dmin)) : 0));
    const at = b * 144;
    dv.setUint16(at, f16Bits(d), true);
    dv.setUint16(at + 2, f16Bits(dmin), true);
    for (let j = 0; j < 4; j++) {
      out[at + 4 + j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
      out[at + 8 + j] = mn[j]! | ((mn[j + 4]! >> 4) << 6);
      out[at + 12 + j] = (sc[j + 4]! & 0xf) | ((mn[j + 4]! & 0xf) << 4);
    }
    for (let j = 0; j < 8; j++) {
      const scale = d * sc[j]!,
        off = dmin * mn[j]!;
      for (let l = 0; l < 32; l++) {
        const q = scale ? Math.max(0, Math.min(15, Math.round((x[b * 256 + 32 * j + l]! + off) / scale))) : 0;
        // Sub-blocks pair up on 32 bytes: even ones in the low nibbles, odd ones in the high.
        out[at + 16 + 32 * (j >> 1) + l]! |= j & 1 ? q << 4 : q;
      }
    }
  }
  return out;
}

function tensorBytes(data: Float32Array, type: GgufType): Uint8Array {
  if (type === "q4_k") return quantizeQ4K(data);
  if (type === "q6_k" || type === "q5_k") {
    // The engine's own plain quantizers (their blocks' reading is checked against ggml's definitions in gguf.test.ts).
    const out = new Uint8Array((data.length / 256) * (type === "q6_k" ? 210 : 176));
    (type === "q6_k" ? quantizeQ6K : quantizeQ5K)(data, 0, data.length, out, 0);
    return out;
  }
  if (type === "q8_0") return quantizeQ8_0(data);
  if (type === "q4_0") return quantizeQ4_0(data);
  if (type === "q4_1" || type === "q5_0" || type === "q5_1") return quantizeLegacy(data, type);
  return encodeValues(data, type);
}

export interface GgufTensorIn {
  name: string;
  shape: number[];
  type: GgufType;
  data?: Float32Array;
  /** Raw bytes instead of data (for types the writer cannot quantize). */
  bytes?: Uint8Array;
  typeId?: number;
}

export function encodeGguf(kvs: readonly GgufKv[], tensors: readonly GgufTensorIn[], opts: { version?: number; alignment?: number } = {}): Uint8Array {
  const align = opts.alignment ?? 32;
  const parts: number[] = [];
  const enc = new TextEncoder();
  const u32 = (v: number) => {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, v, true);
    parts.push(...b);
  };
  const u64 = (v: number | bigint) => {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
    parts.push(...b);
  };
  const str = (s: string) => {
    const b = enc.encode(s);
    u64(b.length);
    for (const x of b) parts.push(x);
  };
  const value = (type: number, v: unknown): void => {
    const b = new Uint8Array(8);
    const dv = new DataView(b.buffer);
    switch (type) {
      case GT.u8:
        parts.push(Number(v) & 0xff);
        return;
      case GT.i8:
        dv.setInt8(0, Number(v));
        parts.push(b[0]!);
        return;
      case GT.u16:
        dv.setUint16(0, Number(v), true);
        parts.push(...b.subarray(0, 2));
        return;
      case GT.i16:
        dv.setInt16(0, Number(v), true);
        parts.push(...b.subarray(0, 2));
        return;
      case GT.u32:
        u32(Number(v));
        return;
      case GT.i32:
        dv.setInt32(0, Number(v), true);
        parts.push(...b.subarray(0, 4));
        return;
      case GT.f32:
        dv.setFloat32(0, Number(v), true);
        parts.push(...b.subarray(0, 4));
        return;
      case GT.bool:
        parts.push(v ? 1 : 0);
        return;
      case GT.str:
        str(String(v));
        return;
      case GT.arr: {
        const [et, vals] = v as [number, unknown[]];
        u32(et);
        u64(vals.length);
        for (const x of vals) value(et, x);
        return;
      }
      case GT.u64:
        u64(BigInt(v as number));
        return;
      case GT.i64:
        dv.setBigInt64(0, BigInt(v as number), true);
        parts.push(...b);
        return;
      case GT.f64:
        dv.setFloat64(0, Number(v), true);
        parts.push(...b);
        return;
    }
    throw new Error(`gguf writer: type ${type}`);
  };
  u32(0x46554747);
  u32(opts.version ?? 3);
  u64(tensors.length);
  u64(kvs.length);
  for (const [k, t, v] of kvs) {
    str(k);
    u32(t);
    value(t, v);
  }
  const blobs = tensors.map((t) => t.bytes ?? tensorBytes(t.data!, t.type));
  let off = 0;
  tensors.forEach((t, i) => {
    str(t.name);
    u32(t.shape.length);
    for (const d of [...t.shape].reverse()) u64(d);
    u32(t.typeId ?? GGML_TYPE_ID[t.type]);
    u64(off);
    off += Math.ceil(blobs[i]!.length / align) * align;
  });
  const headerLen = Math.ceil(parts.length / align) * align;
  const out = new Uint8Array(headerLen + off);
  out.set(parts, 0);
  let at = headerLen;
  for (const b of blobs) {
    out.set(b, at);
    at += Math.ceil(b.length / align) * align;
  }
  return out;
}

export interface GgufModelOptions {
  arch?: "llama" | "qwen2";
  /** Type of the 2-D weight matrices; norms and biases stay f32 as llama.cpp writes them. */
  type?: GgufType;
  /** Type of each 2-D matrix by its tensor name (a mix such as Q4_K_M's), over `type`. */
  typeOf?: (name: string) => GgufType;
  tied?: boolean;
  extraKvs?: GgufKv[];
  alignment?: number;
}

/** A GGUF model file with llama.cpp's key and tensor names and a small llama-type vocabulary. */
export function encodeGgufModel(cfg: ModelConfig, w: Weights, o: GgufModelOptions = {}): Uint8Array {
  const a = o.arch ?? "llama";
  const kvs: GgufKv[] = [
    ["general.architecture", GT.str, a],
    ["general.name", GT.str, cfg.name],
    ["general.alignment", GT.u32, o.alignment ?? 32],
    [`${a}.context_length`, GT.u32, cfg.maxSeqLen],
    [`${a}.embedding_length`, GT.u32, cfg.dim],
    [`${a}.block_count`, GT.u32, cfg.nLayers],
    [`${a}.feed_forward_length`, GT.u32, cfg.hiddenDim],
    [`${a}.attention.head_count`, GT.u32, cfg.nHeads],
    [`${a}.attention.head_count_kv`, GT.u32, cfg.nKvHeads],
    [`${a}.rope.freq_base`, GT.f32, cfg.ropeTheta],
    [`${a}.attention.layer_norm_rms_epsilon`, GT.f32, cfg.normEps],
    [`${a}.rope.dimension_count`, GT.u32, headDimOf(cfg)],
    ["tokenizer.ggml.model", GT.str, "llama"],
    ["tokenizer.ggml.tokens", GT.arr, [GT.str, Array.from({ length: cfg.vocabSize }, (_, i) => `<t${i}>`)]],
    ["tokenizer.ggml.scores", GT.arr, [GT.f32, Array.from({ length: cfg.vocabSize }, (_, i) => -i)]],
    ["tokenizer.ggml.token_type", GT.arr, [GT.i32, Array.from({ length: cfg.vocabSize }, () => 1)]],
    ["tokenizer.ggml.bos_token_id", GT.u32, 1],
    ["tokenizer.ggml.eos_token_id", GT.u32, 2],
    ["tokenizer.chat_template", GT.str, "{{ messages }}"],
  ];
  if (cfg.headDim !== undefined) kvs.push([`${a}.attention.key_length`, GT.u32, cfg.headDim], [`${a}.attention.value_length`, GT.u32, cfg.headDim]);
  kvs.push(...(o.extraKvs ?? []));
  const named = namedTensors(cfg, w, "gguf", { tied: o.tied ?? false, splitHalf: a === "qwen2" });
  const tensors: GgufTensorIn[] = named.map((t) => ({ ...t, type: t.shape.length === 2 ? (o.typeOf?.(t.name) ?? o.type ?? "f32") : "f32" }));
  return encodeGguf(kvs, tensors, { alignment: o.alignment });
}
