import assert from "node:assert";
import { writeFileSync } from "node:fs";
import { basename } from "node:path";
import {
  mapFile,
  DEFAULT_NORM_EPS,
  DEFAULT_ROPE_THETA,
  headDimOf,
  type ModelConfig,
  validateConfig,
  validateWeights,
  weightSizes,
  type Weights,
} from "../compute/index.ts";

// Karpathy's llama2.c "legacy" (version 0) files: a 7 x int32 header, then f32 tensors in
// run.c's memory_map_weights order. Everything little-endian.

const HEADER_BYTES = 28;
/** Versioned llama2.c exports (export.py version >= 1) start with this magic instead. */
const AK42_MAGIC = 0x616b3432;

/** Tensors in file order, up to rms_final; freq_cis real/imag and the optional wcls follow. */
const FILE_ORDER = ["tokenEmbedding", "rmsAtt", "wq", "wk", "wv", "wo", "rmsFfn", "w1", "w2", "w3", "rmsFinal"] as const;

export interface Llama2cModel {
  cfg: ModelConfig;
  weights: Weights;
  /** The header's vocab_size was positive: wcls is tokenEmbedding. */
  sharedClassifier: boolean;
}

/**
 * Reads a legacy checkpoint. Tensors are views into `bytes` (copied once only if the bytes are
 * not 4-byte aligned), so the file's buffer must stay untouched while the model lives.
 */
export interface Llama2cHeader {
  cfg: ModelConfig;
  sharedClassifier: boolean;
  /** f32 values after the header: tensors, the RoPE tables, and wcls unless shared. */
  floats: number;
  /** The exact file length this header implies. */
  fileBytes: number;
  /** The seven header ints, for error messages. */
  raw: number[];
}

/** Reads and validates the 28-byte header (the checkpoint's first bytes; more may follow). */
export function parseLlama2cHeader(bytes: Uint8Array, name = "llama2c"): Llama2cHeader {
  if (bytes.length < HEADER_BYTES) throw new Error(`llama2.c checkpoint is ${bytes.length} bytes, shorter than the ${HEADER_BYTES}-byte header`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dv.getUint32(0, true) === AK42_MAGIC) throw new Error("llama2.c checkpoint has the 'ak42' versioned header; only legacy (version 0) files are read");
  const h = Array.from({ length: 7 }, (_, i) => dv.getInt32(i * 4, true));
  const [dim, hiddenDim, nLayers, nHeads, nKvHeads, vocabRaw, seqLen] = h as [number, number, number, number, number, number, number];
  const cfg: ModelConfig = {
    name,
    dim,
    hiddenDim,
    nLayers,
    nHeads,
    nKvHeads,
    vocabSize: Math.abs(vocabRaw),
    maxSeqLen: seqLen,
    ropeTheta: DEFAULT_ROPE_THETA,
    normEps: DEFAULT_NORM_EPS,
  };
  validateConfig(cfg);
  const sharedClassifier = vocabRaw > 0;
  const sizes = weightSizes(cfg);
  let floats = 0;
  for (const k of FILE_ORDER) floats += sizes[k];
  floats += 2 * seqLen * (headDimOf(cfg) / 2);
  if (!sharedClassifier) floats += sizes.wcls;
  return { cfg, sharedClassifier, floats, fileBytes: HEADER_BYTES + 4 * floats, raw: h };
}

/**
 * Reads a legacy checkpoint. Tensors are views into `bytes` (copied once only if the bytes are
 * not 4-byte aligned), so the file's buffer must stay untouched while the model lives.
 */
export function parseLlama2cCheckpoint(bytes: Uint8Array, name = "llama2c"): Llama2cModel {
  if (bytes.byteOffset % 4 !== 0) bytes = bytes.slice();
  const { cfg, sharedClassifier, floats, fileBytes, raw } = parseLlama2cHeader(bytes, name);
  const sizes = weightSizes(cfg);
  const freqElems = cfg.maxSeqLen * (headDimOf(cfg) / 2);
  if (bytes.length !== fileBytes) {
    throw new Error(`llama2.c checkpoint is ${bytes.length} bytes, header [${raw.join(", ")}] implies ${fileBytes}`);
  }
  const f32 = new Float32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES, floats);
  let at = 0;
  const take = (n: number): Float32Array => {
    const v = f32.subarray(at, at + n);
    at += n;
    return v;
  };
  const w = {} as Weights;
  for (const k of FILE_ORDER) w[k] = take(sizes[k]);
  at += 2 * freqElems;
  w.wcls = sharedClassifier ? w.tokenEmbedding : take(sizes.wcls);
  validateWeights(cfg, w);
  return { cfg, weights: w, sharedClassifier };
}

export function loadLlama2cCheckpoint(path: string): Llama2cModel {
  return parseLlama2cCheckpoint(mapFile(path), basename(path).replace(/\.bin$/, ""));
}

/** The legacy file bytes; the RoPE tables old readers expect are written as run.c would compute them. */
export function encodeLlama2cCheckpoint(cfg: ModelConfig, weights: Weights, sharedClassifier: boolean): Uint8Array {
  validateWeights(cfg, weights);
  assert(headDimOf(cfg) * cfg.nHeads === cfg.dim && !cfg.ropeScaling && !weights.bq, "llama2.c files hold neither head_dim, rope scaling nor biases");
  if (sharedClassifier) {
    assert(weights.wcls === weights.tokenEmbedding || equalF32(weights.wcls, weights.tokenEmbedding), "sharedClassifier but wcls differs from tokenEmbedding");
  }
  const sizes = weightSizes(cfg);
  const half = headDimOf(cfg) / 2;
  const freqElems = cfg.maxSeqLen * half;
  let floats = 0;
  for (const k of FILE_ORDER) floats += sizes[k];
  floats += 2 * freqElems;
  if (!sharedClassifier) floats += sizes.wcls;
  const out = new Uint8Array(HEADER_BYTES + 4 * floats);
  const dv = new DataView(out.buffer);
  const header = [cfg.dim, cfg.hiddenDim, cfg.nLayers, cfg.nHeads, cfg.nKvHeads, sharedClassifier ? cfg.vocabSize : -cfg.vocabSize, cfg.maxSeqLen];
  header.forEach((v, i) => dv.setInt32(i * 4, v, true));
  const f32 = new Float32Array(out.buffer, HEADER_BYTES, floats);
  let at = 0;
  for (const k of FILE_ORDER) {
    f32.set(weights[k], at);
    at += sizes[k];
  }
  for (let p = 0; p < cfg.maxSeqLen; p++) {
    for (let i = 0; i < half; i++) {
      const freq = 1 / Math.pow(cfg.ropeTheta, (2 * i) / (2 * half));
      f32[at + p * half + i] = Math.cos(p * freq);
      f32[at + freqElems + p * half + i] = Math.sin(p * freq);
    }
  }
  at += 2 * freqElems;
  if (!sharedClassifier) f32.set(weights.wcls, at);
  return out;
}

export function writeLlama2cCheckpoint(path: string, cfg: ModelConfig, weights: Weights, sharedClassifier: boolean): void {
  writeFileSync(path, encodeLlama2cCheckpoint(cfg, weights, sharedClassifier));
}

function equalF32(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return false;
  return true;
}
