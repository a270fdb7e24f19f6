// GGUF files of real model shapes with random weights, for bench/llamacpp.ts: the dims, heads,
// KV heads, FFN width, vocabulary size, RoPE base and tying of SmolLM2-135M, Llama-3.2-1B,
// Llama-3.2-3B and Llama-3.1-8B, written as llama.cpp's converter writes an F16 file (2-D
// matrices F16, norms F32, llama.cpp's key and tensor names), streamed tensor by tensor so an
// 8B file (16 GB) never sits in memory. Quantized types come from this F16 file through
// llama.cpp's own llama-quantize.
//
// What is not the real model: the weights (random, see randomF16), Llama 3's `rope_scaling`
// (no rope_freqs table: it changes no cost), and the vocabulary: a byte-level BPE vocabulary
// (GPT-2's 256 byte symbols, then <|begin_of_text|> and <|end_of_text|> as control tokens, then
// "<pN>" padding tokens up to the real vocabulary size) with no merges. Both engines accept it,
// and every row of the embedding and classifier is still read, so the costs are the real ones.
import { closeSync, openSync, renameSync, writeSync } from "node:fs";

/** A llama-architecture shape, as its config.json states it. */
export interface LlamaShape {
  name: string;
  dim: number;
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  vocabSize: number;
  contextLength: number;
  ropeTheta: number;
  normEps: number;
  tied: boolean;
  /** tokenizer.ggml.pre, as llama.cpp's converter names the real model's pre-tokenizer. */
  pre: string;
}

/** The real models' shapes (their config.json on the Hugging Face hub). */
export const SHAPES: Readonly<Record<string, LlamaShape>> = {
  "135m": {
    name: "SmolLM2-135M-shape",
    dim: 576,
    hiddenDim: 1536,
    nLayers: 30,
    nHeads: 9,
    nKvHeads: 3,
    vocabSize: 49152,
    contextLength: 8192,
    ropeTheta: 100000,
    normEps: 1e-5,
    tied: true,
    pre: "smollm",
  },
  "1b": {
    name: "Llama-3.2-1B-shape",
    dim: 2048,
    hiddenDim: 8192,
    nLayers: 16,
    nHeads: 32,
    nKvHeads: 8,
    vocabSize: 128256,
    contextLength: 131072,
    ropeTheta: 500000,
    normEps: 1e-5,
    tied: true,
    pre: "llama-bpe",
  },
  "3b": {
    name: "Llama-3.2-3B-shape",
    dim: 3072,
    hiddenDim: 8192,
    nLayers: 28,
    nHeads: 24,
    nKvHeads: 8,
    vocabSize: 128256,
    contextLength: 131072,
    ropeTheta: 500000,
    normEps: 1e-5,
    tied: true,
    pre: "llama-bpe",
  },
  "8b": {
    name: "Llama-3.1-8B-shape",
    dim: 4096,
    hiddenDim: 14336,
    nLayers: 32,
    nHeads: 32,
    nKvHeads: 8,
    vocabSize: 128256,
    contextLength: 131072,
    ropeTheta: 500000,
    normEps: 1e-5,
    tied: false,
    pre: "llama-bpe",
  },
};

const GGML_F32 = 0;
const GGML_F16 = 1;
const ALIGN = 32;
/** GGUF metadata value types. */
const T = { u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9 } as const;

export interface ShapeTensor {
  name: string;
  /** Outermost first, as the loader reports it (GGUF stores the reverse). */
  shape: number[];
  type: typeof GGML_F32 | typeof GGML_F16;
}

/** The tensors llama.cpp's converter writes for this shape, in its order. */
export function shapeTensors(s: LlamaShape): ShapeTensor[] {
  const hd = s.dim / s.nHeads;
  const kv = s.nKvHeads * hd;
  const out: ShapeTensor[] = [{ name: "token_embd.weight", shape: [s.vocabSize, s.dim], type: GGML_F16 }];
  for (let l = 0; l < s.nLayers; l++) {
    const b = `blk.${l}.`;
    out.push(
      { name: `${b}attn_norm.weight`, shape: [s.dim], type: GGML_F32 },
      { name: `${b}attn_q.weight`, shape: [s.dim, s.dim], type: GGML_F16 },
      { name: `${b}attn_k.weight`, shape: [kv, s.dim], type: GGML_F16 },
      { name: `${b}attn_v.weight`, shape: [kv, s.dim], type: GGML_F16 },
      { name: `${b}attn_output.weight`, shape: [s.dim, s.dim], type: GGML_F16 },
      { name: `${b}ffn_norm.weight`, shape: [s.dim], type: GGML_F32 },
      { name: `${b}ffn_gate.weight`, shape: [s.hiddenDim, s.dim], type: GGML_F16 },
      { name: `${b}ffn_down.weight`, shape: [s.dim, s.hiddenDim], type: GGML_F16 },
      { name: `${b}ffn_up.weight`, shape: [s.hiddenDim, s.dim], type: GGML_F16 },
    );
  }
  out.push({ name: "output_norm.weight", shape: [s.dim], type: GGML_F32 });
  if (!s.tied) out.push({ name: "output.weight", shape: [s.vocabSize, s.dim], type: GGML_F16 });
  return out;
}

/** GPT-2's byte → symbol map: printable bytes stand for themselves, the rest shift above 255. */
export function byteSymbols(): string[] {
  const out = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out[b] = String.fromCodePoint(printable ? b : 256 + extra++);
  }
  return out;
}

export const BOS_ID = 256;
export const EOS_ID = 257;

/** The vocabulary (see the file comment): token strings and llama.cpp token types. */
export function shapeVocab(vocabSize: number): { tokens: string[]; types: number[] } {
  const tokens = [...byteSymbols(), "<|begin_of_text|>", "<|end_of_text|>"];
  if (vocabSize < tokens.length) throw new Error(`vocabulary of ${vocabSize} is smaller than the ${tokens.length} fixed tokens`);
  const types = tokens.map((_, i) => (i >= 256 ? 3 : 1));
  for (let i = tokens.length; i < vocabSize; i++) {
    tokens.push(`<p${i}>`);
    types.push(1);
  }
  return { tokens, types };
}

class Bytes {
  private buf = new Uint8Array(1 << 16);
  private dv = new DataView(this.buf.buffer);
  length = 0;
  private room(n: number): void {
    if (this.length + n <= this.buf.length) return;
    const b = new Uint8Array(Math.max(this.buf.length * 2, this.length + n));
    b.set(this.buf.subarray(0, this.length));
    this.buf = b;
    this.dv = new DataView(b.buffer);
  }
  u32(v: number): void {
    this.room(4);
    this.dv.setUint32(this.length, v, true);
    this.length += 4;
  }
  i32(v: number): void {
    this.room(4);
    this.dv.setInt32(this.length, v, true);
    this.length += 4;
  }
  f32(v: number): void {
    this.room(4);
    this.dv.setFloat32(this.length, v, true);
    this.length += 4;
  }
  u64(v: number): void {
    this.room(8);
    this.dv.setBigUint64(this.length, BigInt(v), true);
    this.length += 8;
  }
  u8(v: number): void {
    this.room(1);
    this.buf[this.length++] = v;
  }
  str(s: string): void {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.room(b.length);
    this.buf.set(b, this.length);
    this.length += b.length;
  }
  pad(align: number): void {
    const n = (align - (this.length % align)) % align;
    this.room(n);
    this.buf.fill(0, this.length, this.length + n);
    this.length += n;
  }
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

type Kv = [string, "u32" | "f32" | "str" | "bool", number | string | boolean] | [string, "strs", string[]] | [string, "i32s", number[]];

function metadata(s: LlamaShape): Kv[] {
  const { tokens, types } = shapeVocab(s.vocabSize);
  const a = "llama";
  return [
    ["general.architecture", "str", a],
    ["general.name", "str", s.name],
    ["general.file_type", "u32", 1], // MOSTLY_F16, as the converter says for an f16 file
    ["general.alignment", "u32", ALIGN],
    [`${a}.context_length`, "u32", s.contextLength],
    [`${a}.embedding_length`, "u32", s.dim],
    [`${a}.block_count`, "u32", s.nLayers],
    [`${a}.feed_forward_length`, "u32", s.hiddenDim],
    [`${a}.attention.head_count`, "u32", s.nHeads],
    [`${a}.attention.head_count_kv`, "u32", s.nKvHeads],
    [`${a}.rope.freq_base`, "f32", s.ropeTheta],
    [`${a}.attention.layer_norm_rms_epsilon`, "f32", s.normEps],
    [`${a}.rope.dimension_count`, "u32", s.dim / s.nHeads],
    [`${a}.vocab_size`, "u32", s.vocabSize],
    ["tokenizer.ggml.model", "str", "gpt2"],
    ["tokenizer.ggml.pre", "str", s.pre],
    ["tokenizer.ggml.tokens", "strs", tokens],
    ["tokenizer.ggml.token_type", "i32s", types],
    ["tokenizer.ggml.merges", "strs", []],
    ["tokenizer.ggml.bos_token_id", "u32", BOS_ID],
    ["tokenizer.ggml.eos_token_id", "u32", EOS_ID],
    ["tokenizer.ggml.add_bos_token", "bool", true],
  ];
}

/** The header, tensor infos and padding up to the data section; offsets of each tensor's data. */
export function shapeHeader(s: LlamaShape): { header: Uint8Array; tensors: ShapeTensor[]; offsets: number[]; dataBytes: number } {
  const b = new Bytes();
  const kvs = metadata(s);
  const tensors = shapeTensors(s);
  b.u32(0x46554747);
  b.u32(3);
  b.u64(tensors.length);
  b.u64(kvs.length);
  for (const [k, t, v] of kvs) {
    b.str(k);
    if (t === "strs" || t === "i32s") {
      b.u32(T.arr);
      b.u32(t === "strs" ? T.str : T.i32);
      b.u64(v.length);
      for (const x of v) typeof x === "string" ? b.str(x) : b.i32(x);
      continue;
    }
    b.u32(T[t]);
    if (t === "str") b.str(v as string);
    else if (t === "u32") b.u32(v as number);
    else if (t === "f32") b.f32(v as number);
    else b.u8(v ? 1 : 0);
  }
  const offsets: number[] = [];
  let off = 0;
  for (const t of tensors) {
    b.str(t.name);
    b.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) b.u64(d);
    b.u32(t.type);
    b.u64(off);
    offsets.push(off);
    off += Math.ceil(tensorBytes(t) / ALIGN) * ALIGN;
  }
  b.pad(ALIGN);
  return { header: b.bytes(), tensors, offsets, dataBytes: off };
}

export function tensorBytes(t: ShapeTensor): number {
  return t.shape.reduce((a, d) => a * d, 1) * (t.type === GGML_F16 ? 2 : 4);
}

/**
 * Random f16 bits of magnitude 2^-10 .. 2^-5 (about what a trained model's weights span) and
 * either sign, from an xorshift32 stream: no value is 0, inf or NaN, and two draws a 32-bit word.
 */
export function randomF16(out: Uint16Array, seed: number): number {
  let x = seed >>> 0 || 1;
  for (let i = 0; i < out.length; i += 2) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = halfOf(x & 0xffff);
    if (i + 1 < out.length) out[i + 1] = halfOf(x >>> 16);
  }
  return x >>> 0;
}

/** 16 random bits → a sign, a biased f16 exponent of 5..10 (2^-10 .. 2^-5) and a 10-bit mantissa. */
function halfOf(r: number): number {
  const sign = r & 0x8000;
  const exp = 5 + ((r >>> 10) % 6); // biased f16 exponent 5..10: 2^-10 .. 2^-5
  return sign | (exp << 10) | (r & 0x3ff);
}

/**
 * Gaussian numbers of standard deviation 0.02 (a trained layer's spread) from an LCG stream by
 * Box-Muller, one per `next()`; `state()` to go on from later.
 */
export function gaussianSource(seed: number): { next(): number; state(): number } {
  let x = seed >>> 0;
  const uniform = (): number => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return (x + 1) / 2 ** 32;
  };
  return { next: () => 0.02 * Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform()), state: () => x };
}

/**
 * gaussianSource's numbers as f16 weights: unlike randomF16's, about 0.24% of them are f16
 * subnormals, each on its own, as in a trained model (what kernels/assembly/f16.ts' THE SHIFTED
 * F16 is for). Returns the state.
 */
export function gaussianF16(out: Uint16Array, seed: number): number {
  const g = gaussianSource(seed);
  const f = new Float16Array(out.buffer, out.byteOffset, out.length);
  for (let i = 0; i < out.length; i++) f[i] = g.next();
  return g.state();
}

/**
 * Writes the shape's F16 file to `path` (through a temporary name, so a killed write never
 * leaves a file that looks whole). Norm weights are 1 ± 1/16, matrices randomF16 (gaussianF16
 * with `gauss`).
 */
export function writeShapeGguf(path: string, s: LlamaShape, seed = 1, progress?: (done: number, total: number) => void, gauss = false): void {
  const { header, tensors, dataBytes } = shapeHeader(s);
  const tmp = `${path}.partial`;
  const fd = openSync(tmp, "w");
  try {
    writeSync(fd, header);
    const CHUNK = 1 << 22; // elements written at a time
    const half = new Uint16Array(CHUNK);
    let state = seed;
    let done = 0;
    const zeros = new Uint8Array(ALIGN);
    for (const t of tensors) {
      const n = t.shape.reduce((a, d) => a * d, 1);
      if (t.type === GGML_F32) {
        const f = new Float32Array(n);
        for (let i = 0; i < n; i++) f[i] = 1 + ((i * 2654435761) % 17) / 128 - 1 / 16;
        writeSync(fd, new Uint8Array(f.buffer));
      } else {
        for (let at = 0; at < n; at += CHUNK) {
          const m = Math.min(CHUNK, n - at);
          state = (gauss ? gaussianF16 : randomF16)(half.subarray(0, m), state);
          writeSync(fd, new Uint8Array(half.buffer, 0, m * 2));
        }
      }
      const b = tensorBytes(t);
      const pad = (ALIGN - (b % ALIGN)) % ALIGN;
      if (pad) writeSync(fd, zeros.subarray(0, pad));
      done += b + pad;
      progress?.(done, dataBytes);
    }
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
}

// `bun bench/gguf-shapes.ts --gauss SIZE PATH`: the SIZE shape's F16 file with gaussianF16
// matrices (README: the shifted f16 coding's decode A/B ran on the 1B one).
if (import.meta.main && process.argv[2] === "--gauss") {
  const [size, path] = process.argv.slice(3);
  const shape = SHAPES[size ?? ""];
  if (!shape || !path) throw new Error(`usage: --gauss SIZE PATH; sizes ${Object.keys(SHAPES).join(", ")}`);
  writeShapeGguf(path, shape, 7, undefined, true);
}
