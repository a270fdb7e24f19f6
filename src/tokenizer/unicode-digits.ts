/**
 * tokenizers' Digits pre-tokenizer splits on Rust's `char::is_numeric` (Unicode categories Nd, Nl,
 * No: "½", "²", "٣" are digits to it); @huggingface/tokenizers 0.2.0 compiles it to JavaScript's
 * ASCII-only `\d`, so SmolLM's `" ½"` came out as one pre-token instead of `" "`, `"½"`. Until the
 * library splits as Rust does (test/tokenizer/unicode-digits.test.ts fails the day it does: then delete
 * this file), tokenizer.json's Digits steps are handed to it as the Split they mean: each numeral
 * alone (`individual_digits`), else runs of them, on `\p{N}`.
 */
export function withUnicodeDigits(tokenizerJson: object): object {
  const json = tokenizerJson as { pre_tokenizer?: unknown };
  if (json.pre_tokenizer === undefined || json.pre_tokenizer === null) return tokenizerJson;
  const pre = rewrite(json.pre_tokenizer);
  return pre === json.pre_tokenizer ? tokenizerJson : { ...json, pre_tokenizer: pre };
}

function rewrite(pre: unknown): unknown {
  if (typeof pre !== "object" || pre === null) return pre;
  const p = pre as { type?: unknown; individual_digits?: unknown; pretokenizers?: unknown };
  if (p.type === "Digits") {
    return { type: "Split", pattern: { Regex: p.individual_digits === true ? "\\p{N}" : "\\p{N}+" }, behavior: "Isolated", invert: false };
  }
  if (p.type === "Sequence" && Array.isArray(p.pretokenizers)) {
    const inner = p.pretokenizers.map(rewrite);
    return inner.every((x, i) => x === (p.pretokenizers as unknown[])[i]) ? pre : { ...p, pretokenizers: inner };
  }
  return pre;
}
