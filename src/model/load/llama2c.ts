import assert from "node:assert";
import { readFileSync, writeFileSync } from "node:fs";
import { basename } from "node:path";
import { mapFile } from "../compute/mapped-file.ts";
import { DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, headDimOf, type ModelConfig, validateConfig } from "../compute/config.ts";
import type { EncodeOptions, Tokenizer } from "../../tokenizer/tokenizer.ts";
import { validateWeights, weightSizes, type Weights } from "../compute/weights.ts";

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

/** One vocabulary entry of tokenizer.bin. */
export interface VocabEntry {
  piece: string | Uint8Array;
  score: number;
}

const utf8Enc = new TextEncoder();
const pieceBytesOf = (p: string | Uint8Array): Uint8Array => (typeof p === "string" ? utf8Enc.encode(p) : p);

/** tokenizer.bin: int32 max_token_length, then per token f32 score, int32 len, len bytes. */
export function encodeLlama2cTokenizer(entries: readonly VocabEntry[]): Uint8Array {
  const pieces = entries.map((e) => pieceBytesOf(e.piece));
  let size = 4;
  let maxLen = 0;
  for (const p of pieces) {
    size += 8 + p.length;
    maxLen = Math.max(maxLen, p.length);
  }
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setInt32(0, maxLen, true);
  let at = 4;
  for (let i = 0; i < pieces.length; i++) {
    dv.setFloat32(at, entries[i]!.score, true);
    dv.setInt32(at + 4, pieces[i]!.length, true);
    out.set(pieces[i]!, at + 8);
    at += 8 + pieces[i]!.length;
  }
  return out;
}

export function writeLlama2cTokenizer(path: string, entries: readonly VocabEntry[]): void {
  writeFileSync(path, encodeLlama2cTokenizer(entries));
}

/**
 * Reads tokenizer.bin. The file does not record its vocabulary size (run.c takes it from the
 * checkpoint): pass `vocabSize` to read exactly that many entries, else entries run to the end.
 */
export function parseLlama2cTokenizer(bytes: Uint8Array, vocabSize?: number): Llama2cTokenizer {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 4) throw new Error(`tokenizer.bin is ${bytes.length} bytes, shorter than its 4-byte header`);
  const maxLen = dv.getInt32(0, true);
  const pieces: Uint8Array[] = [];
  const scores: number[] = [];
  let at = 4;
  while (vocabSize === undefined ? at < bytes.length : pieces.length < vocabSize) {
    if (at + 8 > bytes.length) throw new Error(`tokenizer.bin truncated in entry ${pieces.length} at byte ${at}`);
    const score = dv.getFloat32(at, true);
    const len = dv.getInt32(at + 4, true);
    if (len < 0 || at + 8 + len > bytes.length)
      throw new Error(`tokenizer.bin entry ${pieces.length} has length ${len} at byte ${at}, file is ${bytes.length} bytes`);
    if (len > maxLen) throw new Error(`tokenizer.bin entry ${pieces.length} has length ${len} > max_token_length ${maxLen}`);
    pieces.push(bytes.slice(at + 8, at + 8 + len));
    scores.push(score);
    at += 8 + len;
  }
  return new Llama2cTokenizer(pieces, scores);
}

export function loadLlama2cTokenizer(path: string, vocabSize?: number): Llama2cTokenizer {
  const buf = readFileSync(path);
  return parseLlama2cTokenizer(new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength), vocabSize);
}

const latin1 = (b: Uint8Array): string => {
  let s = "";
  for (let i = 0; i < b.length; i++) s += String.fromCharCode(b[i]!);
  return s;
};

/**
 * run.c's sentencepiece-style BPE: ids 0/1/2 are <unk>/<s>/</s>, bytes fall back to the
 * <0xXX> tokens at id byte+3, and the highest-scoring adjacent merge is applied until none is
 * left. Pieces are compared as raw bytes.
 */
export class Llama2cTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bos = 1;
  readonly eos = 2;
  readonly eosIds = [2];
  readonly addBos = true;
  readonly bosToken = "<s>";
  readonly eosToken = "</s>";
  private readonly pieces: Uint8Array[];
  private readonly keys: string[];
  private readonly scores: Float32Array;
  private readonly index = new Map<string, number>();
  /** For <0xXX> pieces the byte they stand for, else -1. */
  private readonly rawByte: Int16Array;
  private readonly bytePieces: Uint8Array[] = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));

  constructor(pieces: readonly Uint8Array[], scores: ArrayLike<number>) {
    assert(pieces.length === scores.length, `${pieces.length} pieces but ${scores.length} scores`);
    assert(pieces.length >= 3, `vocab of ${pieces.length}: ids 0..2 are <unk>, <s>, </s>`);
    this.vocabSize = pieces.length;
    this.pieces = pieces.slice();
    this.keys = pieces.map(latin1);
    this.scores = Float32Array.from(scores);
    this.rawByte = new Int16Array(pieces.length).fill(-1);
    for (let i = 0; i < pieces.length; i++) {
      if (!this.index.has(this.keys[i]!)) this.index.set(this.keys[i]!, i);
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(this.keys[i]!);
      if (m) this.rawByte[i] = parseInt(m[1]!, 16);
    }
  }

  /** The id whose piece is exactly `piece` (UTF-8), or -1. */
  lookup(piece: string): number {
    return this.index.get(latin1(utf8Enc.encode(piece))) ?? -1;
  }

  score(id: number): number {
    return this.scores[id]!;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const ids: number[] = [];
    if (opts.bos ?? true) ids.push(this.bos);
    const bytes = utf8Enc.encode(text);
    if (bytes.length > 0) {
      // sentencepiece's add_dummy_prefix. run.c assumes " " is in the vocab; fall back to its byte.
      ids.push(this.index.get(" ") ?? 0x20 + 3);
    }
    // One lookup per UTF-8 character (run.c caps a group at 4 bytes), else its bytes.
    let start = 0;
    let len = 0;
    for (let i = 0; i < bytes.length; i++) {
      if ((bytes[i]! & 0xc0) !== 0x80) {
        start = i;
        len = 0;
      }
      len++;
      if (i + 1 < bytes.length && (bytes[i + 1]! & 0xc0) === 0x80 && len < 4) continue;
      const id = this.index.get(latin1(bytes.subarray(start, i + 1)));
      if (id !== undefined) ids.push(id);
      else for (let j = start; j <= i; j++) ids.push(bytes[j]! + 3);
      start = i + 1;
      len = 0;
    }
    // Greedy merges, best score first; ties go to the leftmost pair. Like run.c the BOS id takes
    // part too (its piece "\n<s>\n" never merges in a real vocab).
    for (;;) {
      let best = -1e10;
      let bestId = -1;
      let bestIdx = -1;
      for (let i = 0; i + 1 < ids.length; i++) {
        const id = this.index.get(this.keys[ids[i]!]! + this.keys[ids[i + 1]!]!);
        if (id !== undefined && this.scores[id]! > best) {
          best = this.scores[id]!;
          bestId = id;
          bestIdx = i;
        }
      }
      if (bestIdx < 0) break;
      ids.splice(bestIdx, 2, bestId);
    }
    if (opts.eos) ids.push(this.eos);
    return ids;
  }

  decode(ids: readonly number[]): string {
    const chunks: Uint8Array[] = [];
    let prev = -1;
    for (const id of ids) {
      chunks.push(this.pieceBytes(id, prev));
      prev = id;
    }
    return new TextDecoder("utf-8").decode(concat(chunks));
  }

  pieceBytes(id: number, prev = -1): Uint8Array {
    assert(Number.isInteger(id) && id >= 0 && id < this.vocabSize, `token ${id} outside vocab 0..${this.vocabSize - 1}`);
    if (id === this.bos || id === this.eos) return new Uint8Array(0);
    const raw = this.rawByte[id]!;
    if (raw >= 0) return this.bytePieces[raw]!;
    const p = this.pieces[id]!;
    // sentencepiece drops the dummy-prefix space of the first word.
    return prev === this.bos && p[0] === 0x20 ? p.subarray(1) : p;
  }

  decodeToken(id: number, prev = -1): string {
    return new TextDecoder("utf-8").decode(this.pieceBytes(id, prev));
  }
}

function concat(chunks: readonly Uint8Array[]): Uint8Array {
  let n = 0;
  for (const c of chunks) n += c.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}
