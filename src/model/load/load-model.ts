import { statSync } from "node:fs";
import { basename } from "node:path";
import { assembleWeights, GGUF_NAMING, HF_NAMING, residentBytesOf, type WeightStats } from "./assemble-weights.ts";
import { buildTokenizer, type TokenizerSource, type Tokenizer } from "../../tokenizer/index.ts";
import { type ModelConfig, LoadProgress, mapFile, type DType, type Matrix, type Weights } from "../compute/index.ts";
import { ggufTensorSource, ggufTokenizerSource, openGgufModel, openGgufVocab } from "./gguf-model.ts";
import { idList } from "./hf-config.ts";
import { hfFolderSpec, hfTensorSource, hfTokenizerSource } from "./hf-folder.ts";
import { loadLlama2cCheckpoint, parseLlama2cHeader } from "./llama2c.ts";
import { detectModelFormat, ModelFormatError, type ModelFormat } from "./model-format.ts";
import { DEFAULT_MODEL_NAME, defaultModelDir } from "./default-model.ts";
import { loadSyntheticModel, SYNTHETIC_CONFIG, SYNTHETIC_MODEL_NAME } from "./synthetic.ts";

export type ModelFormatKind = ModelFormat["kind"] | "synthetic";

export interface ModelFilesOptions {
  /** llama2.c only: its tokenizer.bin. */
  tokenizerPath?: string;
  /** Caps the model's context (sizes RoPE tables and attention scratch), e.g. max_model_len. */
  maxSeqLen?: number;
  /** Where the progress line of a slow load goes (default stderr). */
  progress?: (line: string) => void;
  /**
   * The dtype the engine will hold the weights in (default f32). Matrices a safetensors or GGUF
   * file stores in it (any packed DType; "as-stored": each matrix in its own stored dtype, layers
   * of different ones stacked in parts) are kept packed as read, never inflated to f32; the rest
   * arrive as f32.
   */
  dtype?: DType | "as-stored";
}

/** A model's weights and where its tokenizer comes from, read from disk; no tokenizer built yet. */
export interface ModelFiles<M extends Matrix = Matrix> {
  format: ModelFormatKind;
  /** The folder or file name: the default served name. */
  name: string;
  cfg: ModelConfig;
  /**
   * f32, except matrices stored in the `dtype` option's packed dtype, kept as stored. Untouched
   * f32 tensors and unpermuted packed ones are views into the mapped file.
   */
  weights: Weights<M>;
  tokenizerSource: TokenizerSource;
  /** Ids that end generation, from the model's own files (empty: the tokenizer's EOS). */
  eosIds: number[];
  stats: WeightStats;
}

/** Reads the model at `path` (format from the path and its magic bytes), weights included. */
export function readModelFiles(path: string, opts?: ModelFilesOptions & { dtype?: "f32" }): ModelFiles<Float32Array>;
export function readModelFiles(path: string, opts?: ModelFilesOptions): ModelFiles;
export function readModelFiles(path: string, opts: ModelFilesOptions = {}): ModelFiles {
  const fmt = detectModelFormat(path);
  refuseStrayTokenizer(fmt, opts.tokenizerPath);
  const name = defaultName(fmt);
  if (fmt.kind === "llama2c") {
    const tokenizerPath = requireLlama2cTokenizer(fmt.file, opts.tokenizerPath);
    const m = loadLlama2cCheckpoint(fmt.file);
    const cfg = { ...m.cfg, name, maxSeqLen: Math.min(m.cfg.maxSeqLen, opts.maxSeqLen ?? Infinity) };
    return {
      format: "llama2c",
      name,
      cfg,
      weights: m.weights,
      tokenizerSource: { kind: "llama2c", path: tokenizerPath, vocabSize: cfg.vocabSize },
      eosIds: [],
      stats: { parameters: residentBytesOf(m.weights) / 4, dtype: "f32", residentBytes: residentBytesOf(m.weights) },
    };
  }
  if (fmt.kind === "hf") {
    const spec = hfFolderSpec(fmt.dir, opts.maxSeqLen);
    const tokenizerSource = hfTokenizerSource(fmt.dir);
    const src = hfTensorSource(fmt.dir);
    const progress = new LoadProgress(name, src.totalBytes, opts.progress);
    const { weights, stats } = assembleWeights(spec, src, HF_NAMING, (n) => progress.add(n), opts.dtype);
    progress.finish();
    // generation_config.json is what transformers' generate() stops on; config.json may list fewer (Llama 3).
    const genEos = tokenizerSource.kind === "hf" ? idList((tokenizerSource.generationConfig as { eos_token_id?: unknown } | null)?.eos_token_id) : [];
    const eosIds = [...new Set([...spec.eosIds, ...genEos])];
    return { format: "hf", name, cfg: { ...spec.cfg, name }, weights, tokenizerSource, eosIds, stats };
  }
  const g = openGgufModel(fmt.file, opts.maxSeqLen);
  const tokenizerSource = ggufTokenizerSource(g);
  const progress = new LoadProgress(name, g.bytes.length, opts.progress);
  const { weights, stats } = assembleWeights(g.spec, ggufTensorSource(g), GGUF_NAMING, (n) => progress.add(n), opts.dtype);
  progress.finish();
  return { format: "gguf", name, cfg: { ...g.spec.cfg, name }, weights, tokenizerSource, eosIds: g.spec.eosIds, stats };
}

/** A model ready for a Transformer: weights, tokenizer, template, the ids that stop generation. */
export interface ServableModel {
  format: ModelFormatKind;
  /** What /v1/models lists and requests must name. */
  name: string;
  cfg: ModelConfig;
  weights: Weights<Matrix>;
  tokenizer: Tokenizer;
  chatTemplate: string | null;
  eosIds: number[];
  stats: WeightStats;
}

export interface LoadModelOptions extends ModelFilesOptions {
  /** A path, or an embedded model's name; empty or absent: the embedded default (see modelPathOf). */
  modelPath?: string;
  servedModelName?: string;
}

/**
 * What `--model` names: empty or tl-kjv-small is the embedded default (a Hugging Face folder, read
 * like any user's), tl-synthetic-4l the seeded random model tests and benchmarks use, anything else
 * a path. The names win over same-named files in the working directory; `./name` reaches those.
 */
export function modelPathOf(modelPath: string | undefined): string {
  if (!modelPath || modelPath === DEFAULT_MODEL_NAME) return defaultModelDir();
  return modelPath;
}

/** The files of the model `--model` names (tl-synthetic-4l's too), weights included; no tokenizer built. */
export function readModelFilesFor(opts: LoadModelOptions): ModelFiles {
  const path = modelPathOf(opts.modelPath);
  return path === SYNTHETIC_MODEL_NAME ? syntheticFiles() : readModelFiles(path, opts);
}

/**
 * The ids that end generation for a model and its tokenizer: the tokenizer's (tokenizer_config,
 * generation_config, GGUF eot/eom) and the model config's. Throws when the tokenizer has ids the
 * model cannot embed.
 */
export function servingEosIds(name: string, tokenizer: Tokenizer, vocabSize: number, modelEosIds: readonly number[]): number[] {
  if (tokenizer.vocabSize > vocabSize) {
    throw new Error(`${name}: the tokenizer has ${tokenizer.vocabSize} tokens, more than the model's vocab_size ${vocabSize}`);
  }
  return [...new Set([...tokenizer.eosIds, ...modelEosIds])];
}

export async function loadModel(opts: LoadModelOptions): Promise<ServableModel> {
  const files = readModelFilesFor(opts);
  const { tokenizer, chatTemplate } = await buildTokenizer(files.tokenizerSource);
  const eosIds = servingEosIds(files.name, tokenizer, files.cfg.vocabSize, files.eosIds);
  return {
    format: files.format,
    name: opts.servedModelName || files.name,
    cfg: files.cfg,
    weights: files.weights,
    tokenizer,
    chatTemplate,
    eosIds,
    stats: files.stats,
  };
}

function syntheticFiles(): ModelFiles {
  const m = loadSyntheticModel();
  const bytes = residentBytesOf(m.weights);
  return {
    format: "synthetic",
    name: SYNTHETIC_MODEL_NAME,
    cfg: m.cfg,
    weights: m.weights,
    tokenizerSource: { kind: "byte" },
    eosIds: [],
    stats: { parameters: bytes / 4, dtype: "f32", residentBytes: bytes },
  };
}

/** What a gateway needs of a model: its name, tokenizer and context. Reads no tensor data. */
export async function loadTokenizerFor(
  opts: LoadModelOptions,
): Promise<{ name: string; tokenizer: Tokenizer; chatTemplate: string | null; maxSeqLen: number; vocabSize: number }> {
  const path = modelPathOf(opts.modelPath);
  if (path === SYNTHETIC_MODEL_NAME)
    return {
      name: opts.servedModelName || SYNTHETIC_MODEL_NAME,
      tokenizer: (await buildTokenizer({ kind: "byte" })).tokenizer,
      chatTemplate: null,
      maxSeqLen: SYNTHETIC_CONFIG.maxSeqLen,
      vocabSize: SYNTHETIC_CONFIG.vocabSize,
    };
  const fmt = detectModelFormat(path);
  refuseStrayTokenizer(fmt, opts.tokenizerPath);
  let cfg: Pick<ModelConfig, "maxSeqLen" | "vocabSize">;
  let src: TokenizerSource;
  if (fmt.kind === "llama2c") {
    const tokenizerPath = requireLlama2cTokenizer(fmt.file, opts.tokenizerPath);
    cfg = parseLlama2cHeader(mapFile(fmt.file).subarray(0, 28), fmt.file).cfg;
    src = { kind: "llama2c", path: tokenizerPath, vocabSize: cfg.vocabSize };
  } else if (fmt.kind === "hf") {
    cfg = hfFolderSpec(fmt.dir, opts.maxSeqLen).cfg;
    src = hfTokenizerSource(fmt.dir);
  } else {
    // Parsing the header touches only its pages of the mapped file. The architecture is not
    // judged here: a tokenizer serves whatever model it came with (engines refuse what they
    // cannot run when they load the weights).
    const g = openGgufVocab(fmt.file);
    cfg = g;
    src = ggufTokenizerSource(g);
  }
  const { tokenizer, chatTemplate } = await buildTokenizer(src);
  return {
    name: opts.servedModelName || defaultName(fmt),
    tokenizer,
    chatTemplate,
    maxSeqLen: Math.min(cfg.maxSeqLen, opts.maxSeqLen ?? Infinity),
    vocabSize: cfg.vocabSize,
  };
}

function defaultName(fmt: ModelFormat): string {
  return fmt.kind === "hf" ? basename(fmt.dir.replace(/\/+$/, "")) : basename(fmt.file).replace(/\.(gguf|bin)$/, "");
}

function refuseStrayTokenizer(fmt: ModelFormat, tokenizerPath: string | undefined): void {
  if (tokenizerPath && fmt.kind !== "llama2c") {
    const what = fmt.kind === "hf" ? "a Hugging Face folder (its tokenizer.json is used)" : "a GGUF file (its own tokenizer is used)";
    throw new ModelFormatError(`--tokenizer ${tokenizerPath}: only llama2.c checkpoints take --tokenizer; --model is ${what}`);
  }
}

function requireLlama2cTokenizer(file: string, tokenizerPath: string | undefined): string {
  if (!tokenizerPath) throw new ModelFormatError(`--model ${file} is a llama2.c checkpoint: it needs --tokenizer (its tokenizer.bin)`);
  if (!statSync(tokenizerPath, { throwIfNoEntry: false })?.isFile()) throw new ModelFormatError(`--tokenizer ${tokenizerPath}: no such file`);
  return tokenizerPath;
}
