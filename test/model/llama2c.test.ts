import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StreamDecoder, loadLlama2cTokenizer } from "../../src/tokenizer/index.ts";
import { Transformer, loadLlama2cCheckpoint } from "../../src/model/index.ts";
import { type VocabEntry, encodeLlama2cTokenizer, writeLlama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { parseLlama2cCheckpoint, writeLlama2cCheckpoint } from "../../src/model/load/llama2c.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { Seq, TINY, bits, newPool, step, tokens } from "./helpers.ts";

const dir = mkdtempSync(join(tmpdir(), "tl-model-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("llama2c checkpoint", () => {
  for (const shared of [true, false]) {
    test(`checkpoint_round_trip_${shared ? "shared" : "unshared"}_classifier`, () => {
      const cfg = { ...TINY, maxSeqLen: 24 };
      const w = syntheticWeights(cfg, 21, { sharedClassifier: shared });
      const path = join(dir, `m-${shared}.bin`);
      writeLlama2cCheckpoint(path, cfg, w, shared);
      const file = readFileSync(path);
      const header = new Int32Array(file.buffer.slice(file.byteOffset, file.byteOffset + 28));
      expect(Array.from(header)).toEqual([32, 64, 2, 4, 2, shared ? 64 : -64, 24]);

      const got = loadLlama2cCheckpoint(path);
      expect(got.sharedClassifier).toBe(shared);
      expect(got.cfg).toEqual({ ...cfg, name: `m-${shared}` });
      for (const k of Object.keys(w) as (keyof typeof w)[]) expect(bits(got.weights[k]!)).toEqual(bits(w[k]!));
      if (shared) expect(got.weights.wcls).toBe(got.weights.tokenEmbedding);

      const p = tokens(9, 22);
      const want = step(new Transformer(cfg, w), new Seq(newPool()), p);
      const have = step(new Transformer(got.cfg, got.weights), new Seq(newPool()), p);
      expect(bits(have)).toEqual(bits(want));
    });
  }

  test("checkpoint rejects wrong length", () => {
    const cfg = { ...TINY, maxSeqLen: 8 };
    const path = join(dir, "short.bin");
    writeLlama2cCheckpoint(path, cfg, syntheticWeights(cfg, 1), false);
    const bytes = new Uint8Array(readFileSync(path));
    expect(() => parseLlama2cCheckpoint(bytes.subarray(0, bytes.length - 4))).toThrow(/implies/);
    expect(() => parseLlama2cCheckpoint(bytes.subarray(0, 10))).toThrow(/header/);
    // A shared-classifier header over an unshared file is 64*32 floats too long.
    const flipped = bytes.slice();
    new DataView(flipped.buffer).setInt32(20, 64, true);
    expect(() => parseLlama2cCheckpoint(flipped)).toThrow(/implies/);
  });
});

/** A vocab in llama2.c's shape: <unk>, <s>, </s>, 256 byte tokens, then merges. */
function vocab(extra: [string, number][]): VocabEntry[] {
  const v: VocabEntry[] = [
    { piece: "<unk>", score: 0 },
    { piece: "\n<s>\n", score: 0 },
    { piece: "\n</s>\n", score: 0 },
  ];
  for (let b = 0; b < 256; b++) v.push({ piece: `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, score: 0 });
  for (const [piece, score] of extra) v.push({ piece, score });
  return v;
}

describe("llama2c tokenizer", () => {
  const entries = vocab([
    [" ", -1],
    ["a", -2],
    ["b", -3],
    ["c", -4],
    ["ab", -5],
    ["bc", -6],
    [" ab", -7],
    ["abc", -8],
    [" abc", -20],
    ["▁x", -9],
  ]);
  const id = (piece: string): number => entries.findIndex((e) => e.piece === piece);

  test("tokenizer bin exact bytes", () => {
    const bytes = encodeLlama2cTokenizer([
      { piece: "a", score: 1.5 },
      { piece: "é", score: -2 },
    ]);
    expect(Array.from(bytes)).toEqual([2, 0, 0, 0 /* max_token_length */, 0, 0, 0xc0, 0x3f, 1, 0, 0, 0, 0x61, 0, 0, 0, 0xc0, 2, 0, 0, 0, 0xc3, 0xa9]);
  });

  test("tokenizer bin round trip", () => {
    const path = join(dir, "tokenizer.bin");
    writeLlama2cTokenizer(path, entries);
    const tok = loadLlama2cTokenizer(path);
    expect(tok.vocabSize).toBe(entries.length);
    for (let i = 0; i < entries.length; i++) {
      expect(tok.score(i)).toBe(entries[i]!.score);
      expect(tok.lookup(entries[i]!.piece as string)).toBe(i);
    }
    expect(loadLlama2cTokenizer(path, 10).vocabSize).toBe(10);
    writeFileSync(path, readFileSync(path).subarray(0, 40));
    expect(() => loadLlama2cTokenizer(path)).toThrow(/truncated|length/);
  });

  test("bpe encode merges by best score", () => {
    const path = join(dir, "tok2.bin");
    writeLlama2cTokenizer(path, entries);
    const tok = loadLlama2cTokenizer(path);
    // " " a b c: " a" is no piece; ab (-5) beats bc (-6); then " ab" (-7) beats abc (-8); " abc" needs
    // " ab"+"c", which is a piece (-20), so it merges last.
    expect(tok.encode("abc")).toEqual([1, id(" abc")]);
    // " " c a b: only ab merges; " c" and "cab" are not pieces.
    expect(tok.encode("cab")).toEqual([1, id(" "), id("c"), id("ab")]);
    expect(tok.encode("bc", { bos: false, eos: true })).toEqual([id(" "), id("bc"), 2]);
    // é is not in the vocab: byte fallback to <0xC3> <0xA9> at byte+3.
    expect(tok.encode("aé")).toEqual([1, id(" "), id("a"), 0xc3 + 3, 0xa9 + 3]);
    expect(tok.encode("")).toEqual([1]);
    expect(tok.decode(tok.encode("abc cab aé"))).toBe("abc cab aé");
  });

  test("bpe decode strips space after bos and stitches bytes", () => {
    const tok = loadLlama2cTokenizerFrom(entries);
    expect(tok.decodeToken(id(" ab"), 1)).toBe("ab");
    expect(tok.decodeToken(id(" ab"), id("a"))).toBe(" ab");
    expect(tok.decode([1, id(" ab"), 0x41 + 3, 2])).toBe("abA");
    const sd = new StreamDecoder(tok);
    expect([1, id(" ab"), 0xc3 + 3, 0xa9 + 3, id("b")].map((t) => sd.push(t))).toEqual(["", "ab", "", "é", "b"]);
  });
});

function loadLlama2cTokenizerFrom(entries: VocabEntry[]) {
  const path = join(dir, `tok-${entries.length}.bin`);
  writeLlama2cTokenizer(path, entries);
  return loadLlama2cTokenizer(path);
}
