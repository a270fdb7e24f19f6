import assert from "node:assert";
import { readFileSync, writeFileSync } from "node:fs";
import type { EncodeOptions, Tokenizer } from "./tokenizer.ts";

// Karpathy's llama2.c tokenizer.bin and the BPE run.c encodes with; the checkpoint beside it
// is src/model/load/llama2c.ts.

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
