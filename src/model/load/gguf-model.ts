import { basename } from "node:path";
import type { TensorSource } from "./assemble-weights.ts";
import { ggmlDtype, ggmlTypeName, GGUF_READABLE_TYPES, type GgufFile, type GgufValue, ggufTensor, parseGguf } from "./gguf.ts";
import { ggufModelSpec } from "./gguf-config.ts";
import { type FileBytes, MAX_MAPPING, mapFileBytes } from "../compute/index.ts";
import { type ModelSpec, UnsupportedModelError } from "./model-spec.ts";
import { toFloat32 } from "./raw-tensor.ts";
import type { GgufTokenizerMeta, TokenizerSource } from "../../tokenizer/index.ts";
import { quote } from "../../codec/index.ts";

export interface GgufModelFile {
  file: string;
  bytes: FileBytes;
  gguf: GgufFile;
  spec: ModelSpec;
}

/** Maps and parses a GGUF file, refusing unreadable tensor types by name before any tensor is read. */
export function openGgufModel(file: string, maxSeqLen?: number): GgufModelFile {
  const bytes = mapFileBytes(file);
  // The header is read from the file's first mapping; tensors are views of their own ranges.
  const gguf = parseGguf(bytes.subarray(0, Math.min(bytes.length, MAX_MAPPING)), file, bytes.length);
  const bad = new Map<string, string>();
  for (const t of gguf.tensors) if (ggmlDtype(t.type) === null && !bad.has(ggmlTypeName(t.type))) bad.set(ggmlTypeName(t.type), t.name);
  if (bad.size > 0) {
    const list = [...bad].map(([type, name]) => `${type} (e.g. ${quote(name)})`).join(", ");
    throw new UnsupportedModelError(
      `--model ${file}: a GGUF file with ${[...bad.keys()].join(", ")} tensors: ${list}; supported tensor types: ${GGUF_READABLE_TYPES}`,
    );
  }
  const has = (n: string) => gguf.tensors.find((t) => t.name === n);
  const embd = has("token_embd.weight");
  const freqs = has("rope_freqs.weight");
  const spec = ggufModelSpec(
    gguf.meta,
    {
      hasOutput: has("output.weight") !== undefined,
      hasQBias: has("blk.0.attn_q.bias") !== undefined,
      vocabRows: embd && embd.shape.length === 2 ? embd.shape[0]! : null,
      ropeFactors: freqs ? toFloat32(ggufTensor(bytes, gguf, freqs)) : null,
    },
    basename(file).replace(/\.gguf$/, ""),
    maxSeqLen,
  );
  return { file, bytes, gguf, spec };
}

/**
 * What a tokenizer-only reader (the gateway) needs of a GGUF file: its header, and the context and
 * vocabulary sizes its `<arch>.*` keys give, for any `general.architecture`: llama.cpp's
 * vocabulary-only files (ggml-vocab-*.gguf) carry architectures no engine here runs, and no
 * tensors. No context length: Infinity (the caller's max_model_len bounds it).
 */
export function openGgufVocab(file: string): { file: string; gguf: GgufFile; maxSeqLen: number; vocabSize: number } {
  const bytes = mapFileBytes(file);
  // The header lies in the first mapping (a vocabulary-only file is all header).
  const gguf = parseGguf(bytes.subarray(0, Math.min(bytes.length, MAX_MAPPING)), file, bytes.length);
  const meta = gguf.meta;
  const arch = meta.get("general.architecture");
  const key = (k: string) => (typeof arch === "string" ? meta.get(`${arch}.${k}`) : undefined);
  const positive = (v: GgufValue | undefined) => (typeof v === "number" && Number.isSafeInteger(v) && v > 0 ? v : null);
  const embd = gguf.tensors.find((t) => t.name === "token_embd.weight");
  const tokens = meta.get("tokenizer.ggml.tokens");
  const vocabSize = positive(key("vocab_size")) ?? (embd && embd.shape.length === 2 ? embd.shape[0]! : null) ?? (Array.isArray(tokens) ? tokens.length : 0);
  return { file, gguf, maxSeqLen: positive(key("context_length")) ?? Infinity, vocabSize };
}

export function ggufTensorSource(m: GgufModelFile): TensorSource {
  const byName = new Map(m.gguf.tensors.map((t) => [t.name, t]));
  return { names: () => byName.keys(), get: (n) => (byName.has(n) ? ggufTensor(m.bytes, m.gguf, byName.get(n)!) : undefined) };
}

/** The tokenizer.* keys, type-checked; the builder decides which models it supports. */
export function ggufTokenizerSource(m: Pick<GgufModelFile, "file" | "gguf">): TokenizerSource {
  const meta = m.gguf.meta;
  const where = (k: string) => `${m.file}: GGUF ${k}`;
  const str = (k: string): string | null => {
    const v = meta.get(k);
    if (v === undefined) return null;
    if (typeof v !== "string") throw new Error(`${where(k)} is not a string`);
    return v;
  };
  const strs = (k: string): string[] | null => {
    const v = meta.get(k);
    if (v === undefined) return null;
    if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) throw new Error(`${where(k)} is not an array of strings`);
    return v as string[];
  };
  const nums = (k: string): number[] | null => {
    const v = meta.get(k);
    if (v === undefined) return null;
    if (!Array.isArray(v) || !v.every((x) => typeof x === "number")) throw new Error(`${where(k)} is not an array of numbers`);
    return v as number[];
  };
  const id = (k: string): number | null => {
    const v: GgufValue | undefined = meta.get(k);
    return typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : null;
  };
  const bool = (k: string): boolean | null => (typeof meta.get(k) === "boolean" ? (meta.get(k) as boolean) : null);
  const model = str("tokenizer.ggml.model");
  const tokens = strs("tokenizer.ggml.tokens");
  if (model === null || tokens === null) throw new Error(`${m.file}: GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)`);
  const meta2: GgufTokenizerMeta = {
    model,
    pre: str("tokenizer.ggml.pre"),
    tokens,
    scores: nums("tokenizer.ggml.scores"),
    tokenTypes: nums("tokenizer.ggml.token_type"),
    merges: strs("tokenizer.ggml.merges"),
    bosId: id("tokenizer.ggml.bos_token_id"),
    eosId: id("tokenizer.ggml.eos_token_id"),
    unknownId: id("tokenizer.ggml.unknown_token_id"),
    paddingId: id("tokenizer.ggml.padding_token_id"),
    addBos: bool("tokenizer.ggml.add_bos_token"),
    addEos: bool("tokenizer.ggml.add_eos_token"),
    addSpacePrefix: bool("tokenizer.ggml.add_space_prefix"),
    chatTemplate: str("tokenizer.chat_template"),
  };
  return { kind: "gguf", file: m.file, meta: meta2 };
}
