// GGUF vocabularies against llama.cpp's tokenizer: each tokenizer.ggml.pre splits text as
// llama.cpp's llm_tokenizer_bpe does (its regex_exprs, one after another over the pieces the
// previous ones left), and SentencePiece files honour tokenizer.ggml.add_space_prefix. The
// vocabularies are written here as vocabulary-only GGUF files, like llama.cpp's ggml-vocab-*.gguf.
import { describe, expect, test } from "bun:test";
import { SequencePreTokenizer, ByteLevelPreTokenizer } from "@huggingface/tokenizers";
import { buildTokenizer } from "../../src/tokenizer/build-tokenizer.ts";
import { byteLevelBytes } from "../../src/tokenizer/byte-level.ts";
import { parseGguf } from "../../src/model/load/gguf.ts";
import { ggufTokenizerSource } from "../../src/model/load/gguf-model.ts";
import { ggufTokenizerFiles } from "../../src/tokenizer/gguf-vocab.ts";
import type { GgufTokenizerMeta } from "../../src/tokenizer/tokenizer-source.ts";
import { byteLevelGgufMeta, spmGgufMeta, vocabOnlyGguf } from "../support/tokenizer-files.ts";

const TEXT = "Hello, world! 12345 ied 4 ½ months\n\n  end";

/** The pre-tokens a GGUF file's tokenizer.ggml.pre gives `text`, as text. */
function preTokens(pre: string | null, text: string): string[] {
  const json = ggufTokenizerFiles({ ...byteLevelGgufMeta({ pre: "qwen2", bos: false }), pre }, "/v.gguf").tokenizerJson as { pre_tokenizer: { type: string } };
  const p = json.pre_tokenizer;
  const lib = p.type === "Sequence" ? new SequencePreTokenizer(p as never) : new ByteLevelPreTokenizer(p as never);
  return lib.pre_tokenize(text).map((piece: string) => new TextDecoder().decode(byteLevelBytes(piece)!));
}

/** What llama.cpp's regex_exprs leave of TEXT, worked out by hand from each list of regexes. */
const EXPECTED: Record<string, string[]> = {
  // GPT-2's one regex.
  mpt: ["Hello", ",", " world", "!", " 12345", " ied", " 4", " ½", " months", "\n\n ", " end"],
  // \p{N} alone first, then GPT-2's: every numeral, ASCII or not, is its own piece.
  starcoder: ["Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " ied", " ", "4", " ", "½", " months", "\n\n ", " end"],
  // Punctuation runs, GPT-2's, then ASCII digits in threes.
  falcon: ["Hello", ",", " world", "!", " ", "123", "45", " ied", " 4", " ½", " months", "\n\n ", " end"],
  // Newlines alone, letters with one leading space, punctuation, CJK, numerals one by one.
  "deepseek-coder": ["Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " ied", " ", "4", " ", "½", " months", "\n", "\n", " ", " end"],
  // Newlines, listed letters, ASCII/fullwidth punctuation (ASCII letters too), trailing spaces, CJK, numeral runs.
  "deepseek-llm": ["Hello", ",", " world", "!", " ", "12345", " ied", " ", "4", " ", "½", " months", "\n", "\n", " ", " end"],
  // llama.cpp's default: punctuation runs, GPT-2's, numeral runs, ASCII digits in threes.
  default: ["Hello", ",", " world", "!", " ", "123", "45", " ied", " ", "4", " ", "½", " months", "\n\n ", " end"],
};
EXPECTED.refact = EXPECTED.starcoder!;
EXPECTED["command-r"] = EXPECTED.starcoder!;
EXPECTED.smollm = EXPECTED.starcoder!;

/**
 * The byte-level fixture vocabulary plus " ½" as one token (Ġ Â½), so GPT-2's split gives it one id
 * and a split that isolates numerals gives two.
 */
function withHalf(pre: string | null): GgufTokenizerMeta {
  const base = byteLevelGgufMeta({ pre: "qwen2", bos: false });
  const tokens = [...base.tokens, "Â½", "ĠÂ½"];
  return {
    ...base,
    pre,
    tokens,
    tokenTypes: [...Array.from(base.tokenTypes!), 1, 1],
    merges: [...base.merges!, "Â ½", "Ġ Â½"],
  };
}

async function fromFile(meta: GgufTokenizerMeta, arch: string, extra: Parameters<typeof vocabOnlyGguf>[2] = []) {
  const file = `/models/ggml-vocab-${arch}.gguf`;
  const src = ggufTokenizerSource({ file, gguf: parseGguf(vocabOnlyGguf(meta, arch, extra), file) });
  return (await buildTokenizer(src)).tokenizer;
}

describe("tokenizer.ggml.pre as llama.cpp splits it", () => {
  for (const [pre, want] of Object.entries(EXPECTED)) {
    test(`pre ${pre} splits as llama.cpp`, () => {
      expect(preTokens(pre, TEXT)).toEqual(want);
    });
  }

  test("missing pre is llama.cpp default", () => {
    expect(preTokens(null, TEXT)).toEqual(EXPECTED.default!);
  });

  test("deepseek llm letters cover astral and letterlike", () => {
    // Deseret (U+10400) is in DeepSeek's letter list; so is the ohm sign (U+2126), but its "CJK"
    // range U+0800-U+4E00 takes it out again afterwards, as llama.cpp's list does.
    expect(preTokens("deepseek-llm", "\u{10400}\u{10401} \u2126x 你好")).toEqual(["\u{10400}\u{10401}", " ", "\u2126", "x", " ", "你好"]);
  });

  test("vocab only files give llama.cpp ids for a non ascii numeral", async () => {
    for (const [pre, arch] of [
      ["refact", "refact"],
      ["starcoder", "starcoder"],
      ["command-r", "command-r"],
      ["smollm", "llama"],
    ] as const) {
      const tok = await fromFile(withHalf(pre), arch);
      // llama.cpp: " ½" → [" ", "½"] (the issue's [220, 23141]).
      expect(tok.encode(" ½").map((id) => tok.decode([id]))).toEqual([" ", "½"]);
    }
    const mpt = await fromFile(withHalf("mpt"), "mpt");
    expect(mpt.encode(" ½").map((id) => mpt.decode([id]))).toEqual([" ½"]);
  });
});

describe("tokenizer.ggml.add space prefix", () => {
  test("spm without space prefix prepends nothing", async () => {
    const meta = spmGgufMeta();
    const piece = (tok: { encode(t: string, o?: { bos?: boolean }): number[] }, text: string) => tok.encode(text, { bos: false }).map((id) => meta.tokens[id]);
    const off = await fromFile({ ...meta, addSpacePrefix: false }, "llama");
    const on = await fromFile({ ...meta, addSpacePrefix: true }, "llama");
    const unset = await fromFile(meta, "llama");
    // llama.cpp: "Äpfel" starts with "Ä", not "▁Ä"; " " is one ▁, not ▁▁.
    expect(piece(off, "hello")).toEqual(["h", "e", "ll", "o"]);
    expect(piece(off, " ")).toEqual(["▁"]);
    expect(piece(on, "hello")).toEqual(["▁hello"]);
    expect(piece(on, " ")).toEqual(piece(unset, " "));
    expect(piece(on, " ")).not.toEqual(["▁"]);
    expect(piece(unset, "hello")).toEqual(["▁hello"]);
    // Without the prefix there is no first space to strip when decoding.
    expect(off.decode(off.encode(" hello world"))).toBe(" hello world");
    expect(on.decode(on.encode("hello world"))).toBe("hello world");
  });
});
