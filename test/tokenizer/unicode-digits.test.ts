// The local fix for @huggingface/tokenizers' Digits pre-tokenizer (src/tokenizer/unicode-digits.ts).
import { describe, expect, test } from "bun:test";
import { DigitsPreTokenizer } from "@huggingface/tokenizers";
import { buildTokenizer } from "../../src/tokenizer/build-tokenizer.ts";
import { withUnicodeDigits } from "../../src/tokenizer/unicode-digits.ts";
import { byteLevelTokenizerJson } from "../support/tokenizer-files.ts";

describe("Digits over every numeral", () => {
  test("library digits still ascii only", () => {
    // Fails the day the library splits on char::is_numeric as Rust's tokenizers does: then delete
    // src/tokenizer/unicode-digits.ts and this file.
    const lib = new DigitsPreTokenizer({ type: "Digits", individual_digits: true } as never);
    expect(lib.pre_tokenize(" ½ 4")).toEqual([" ½ ", "4"]);
  });

  test("smollm tokenizer json splits non ascii numerals", async () => {
    // SmolLM's tokenizer.json: Digits(individual) then ByteLevel; " ½" must be " " and "½" (Rust: [220, 23141]).
    const { json, tokens } = byteLevelTokenizerJson({ pre: "smollm", bos: false });
    const model = (json as { model: { vocab: Record<string, number>; merges: string[] } }).model;
    const vocab = { ...model.vocab, "Â½": tokens.length + 10, "ĠÂ½": tokens.length + 11 };
    const withHalf = { ...json, model: { ...model, vocab, merges: [...model.merges, "Â ½", "Ġ Â½"] } };
    const tok = (
      await buildTokenizer({
        kind: "hf",
        dir: "/m",
        tokenizerJson: withHalf,
        tokenizerConfig: { eos_token: "<|im_end|>" },
        generationConfig: null,
        configEosIds: [],
        configBosId: null,
      })
    ).tokenizer;
    expect(tok.encode(" ½").map((id) => tok.decode([id]))).toEqual([" ", "½"]);
  });

  test("rewrite keeps other steps and runs", () => {
    const seq = { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: false }, { type: "ByteLevel" }] };
    const out = withUnicodeDigits({ pre_tokenizer: seq }) as { pre_tokenizer: { pretokenizers: object[] } };
    expect(out.pre_tokenizer.pretokenizers).toEqual([
      { type: "Split", pattern: { Regex: "\\p{N}+" }, behavior: "Isolated", invert: false },
      { type: "ByteLevel" },
    ]);
    const plain = { pre_tokenizer: { type: "ByteLevel" } };
    expect(withUnicodeDigits(plain)).toBe(plain);
  });
});
