import type { GgufTokenizerMeta } from "./tokenizer-source.ts";
import { quote } from "../codec/index.ts";

/** tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
const TokenType = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

/** The tokenizer.ggml.model values this engine maps onto tokenizer.json. */
export const GGUF_TOKENIZER_MODELS = ["llama", "gpt2"] as const;

const LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/** GPT-2's split (ByteLevel's use_regex), for sequences that split something else first. */
const GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/** The letters of DeepSeek LLM's tokenizer.json (Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi, Adlam ...). */
const DEEPSEEK_LETTERS =
  "A-Za-z\\u00b5\\u00c0-\\u00d6\\u00d8-\\u00f6\\u00f8-\\u01ba\\u01bc-\\u01bf\\u01c4-\\u0293\\u0295-\\u02af\\u0370-\\u0373\\u0376\\u0377\\u037b-\\u037d\\u037f\\u0386\\u0388-\\u038a\\u038c\\u038e-\\u03a1\\u03a3-\\u03f5\\u03f7-\\u0481\\u048a-\\u052f\\u0531-\\u0556\\u10a0-\\u10c5\\u13a0-\\u13f5\\u13f8-\\u13fd\\u1c90-\\u1cba\\u1cbd-\\u1cbf\\u1d00-\\u1d2b\\u1d6b-\\u1d77\\u1d79-\\u1d9a\\u1e00-\\u1f15\\u1f18-\\u1f1d\\u1f20-\\u1f45\\u1f48-\\u1f4d\\u1f50-\\u1f57\\u1f59\\u1f5b\\u1f5d\\u1f5f-\\u1f7d\\u1f80-\\u1fb4\\u1fb6-\\u1fbc\\u1fbe\\u1fc2-\\u1fc4\\u1fc6-\\u1fcc\\u1fd0-\\u1fd3\\u1fd6-\\u1fdb\\u1fe0-\\u1fec\\u1ff2-\\u1ff4\\u1ff6-\\u1ffc\\u2102\\u2107\\u210a-\\u2113\\u2115\\u2119-\\u211d\\u2124\\u2126\\u2128\\u212a-\\u212d\\u212f-\\u2134\\u2139\\u213c-\\u213f\\u2145-\\u2149\\u214e\\u2183\\u2184\\u2c00-\\u2c7b\\u2c7e-\\u2ce4\\u2ceb-\\u2cee\\u2cf2\\u2cf3\\ua640-\\ua66d\\ua680-\\ua69b\\ua722-\\ua76f\\ua771-\\ua787\\ua78b-\\ua78e\\uab70-\\uabbf\\ufb00-\\ufb06\\ufb13-\\ufb17\\uff21-\\uff3a\\uff41-\\uff5a\\u{10400}-\\u{1044f}\\u{104b0}-\\u{104d3}\\u{104d8}-\\u{104fb}\\u{10c80}-\\u{10cb2}\\u{10cc0}-\\u{10cf2}\\u{118a0}-\\u{118df}\\u{1e900}-\\u{1e943}";
/** CJK ideographs, the blocks from Samaritan to them, and Hangul, as DeepSeek's split names them. */
const DEEPSEEK_CJK = "[\\u4e00-\\u9fa5\\u0800-\\u4e00\\uac00-\\ud7ff]+";

const byteLevel = (useRegex: boolean) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex });
const isolated = (regex: string) => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false });
/** Each regex splits every piece the ones before it left (matches and gaps both stay), then bytes map to the alphabet: llama.cpp's regex_exprs. */
const splits = (...regexes: string[]) => ({ type: "Sequence", pretokenizers: [...regexes.map(isolated), byteLevel(false)] });

const GPT2 = { pre: byteLevel(true), ignoreMerges: false };
/** Every numeric character (\\p{N}, Rust's char::is_numeric) alone, then GPT-2's split. */
const DIGITS_THEN_GPT2 = { pre: splits("\\p{N}", GPT2_SPLIT), ignoreMerges: false };

/**
 * tokenizer.ggml.pre → the pre-tokenizer, as llama.cpp's llm_tokenizer_bpe splits each name (its
 * regex_exprs, applied one after another): GPT-2's split; Llama 3's (digits in threes); Qwen2's
 * (single digits); every numeral alone then GPT-2's (SmolLM, StarCoder, Refact, Command-R);
 * Falcon's (punctuation runs, GPT-2's, then ASCII digits in threes); DeepSeek's per-script
 * splits. `ignoreMerges`: a whole pre-token in the vocabulary is one token (Llama 3).
 *
 * A BPE file without `tokenizer.ggml.pre`, or with "default", gets llama.cpp's default split
 * (punctuation runs, GPT-2's, numbers, ASCII digits in threes), so the same file gives llama.cpp's
 * ids here. A name neither knows is refused: llama.cpp falls back to the default with a warning,
 * which silently tokenizes wrongly.
 */
const PRE_TOKENIZERS: Record<string, { pre: object; ignoreMerges: boolean }> = {
  default: { pre: splits("[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_SPLIT, "\\p{N}+", "[0-9][0-9][0-9]"), ignoreMerges: false },
  "gpt-2": GPT2,
  mpt: GPT2,
  "llama-bpe": { pre: { type: "Sequence", pretokenizers: [isolated(LLAMA3_SPLIT), byteLevel(false)] }, ignoreMerges: true },
  "smaug-bpe": { pre: { type: "Sequence", pretokenizers: [isolated(LLAMA3_SPLIT), byteLevel(false)] }, ignoreMerges: true },
  qwen2: { pre: { type: "Sequence", pretokenizers: [isolated(QWEN2_SPLIT), byteLevel(false)] }, ignoreMerges: false },
  smollm: DIGITS_THEN_GPT2,
  starcoder: DIGITS_THEN_GPT2,
  refact: DIGITS_THEN_GPT2,
  "command-r": DIGITS_THEN_GPT2,
  falcon: { pre: splits("[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_SPLIT, "[0-9][0-9][0-9]"), ignoreMerges: false },
  "deepseek-llm": {
    pre: splits(
      "[\\r\\n]",
      `\\s?[${DEEPSEEK_LETTERS}]+`,
      "\\s?[!-/:-~\\uff01-\\uff0f\\uff1a-\\uff5e\\u2018-\\u201f\\u3000-\\u3002]+",
      "\\s+$",
      DEEPSEEK_CJK,
      "\\p{N}+",
    ),
    ignoreMerges: false,
  },
  "deepseek-coder": { pre: splits("[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", DEEPSEEK_CJK, "\\p{N}"), ignoreMerges: false },
};

/** What llama.cpp also treats as end-of-generation when a control token has this text. */
const EOG_TEXTS = ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "<end_of_turn>"];

/** A tokenizer.json equivalent of a GGUF vocabulary, and what tokenizer_config.json would say. */
export interface GgufTokenizerFiles {
  tokenizerJson: object;
  bos: number | null;
  eos: number | null;
  extraEosIds: number[];
  addBos: boolean;
}

/**
 * Builds tokenizer.json from `tokenizer.ggml.*`, as transformers' GGUF loading does: "gpt2" is
 * byte-level BPE with the file's merges and the pre-tokenizer `tokenizer.ggml.pre` names; "llama"
 * is SentencePiece BPE (merges ordered by the merged piece's score, byte fallback, ▁ for spaces).
 * Control and user-defined tokens become added tokens, so their text in a prompt is one token.
 */
export function ggufTokenizerFiles(meta: GgufTokenizerMeta, file: string): GgufTokenizerFiles {
  const n = meta.tokens.length;
  if (n === 0) throw new Error(`${file}: tokenizer.ggml.tokens is empty`);
  for (const [key, arr] of [
    ["scores", meta.scores],
    ["token_type", meta.tokenTypes],
  ] as const) {
    if (arr && arr.length !== n) throw new Error(`${file}: tokenizer.ggml.${key} has ${arr.length} entries for ${n} tokens`);
  }
  const checkId = (key: string, id: number | null) => {
    if (id !== null && (!Number.isInteger(id) || id < 0 || id >= n))
      throw new Error(`${file}: tokenizer.ggml.${key} = ${id} outside the vocabulary 0..${n - 1}`);
    return id;
  };
  const bosId = checkId("bos_token_id", meta.bosId);
  const eosId = checkId("eos_token_id", meta.eosId);
  checkId("unknown_token_id", meta.unknownId);
  const types = meta.tokenTypes ?? new Array<number>(n).fill(TokenType.normal);
  const model = meta.model === "llama" ? spmModel(meta, file, types) : meta.model === "gpt2" ? bpeModel(meta, file) : unsupported(meta.model, file);
  const addBos = meta.addBos ?? meta.model === "llama";
  const extraEosIds: number[] = [];
  for (let id = 0; id < n; id++) {
    if (types[id] === TokenType.control && EOG_TEXTS.includes(meta.tokens[id]!) && id !== eosId) extraEosIds.push(id);
  }
  const bosToken = bosId === null ? null : meta.tokens[bosId]!;
  return {
    tokenizerJson: {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: addedTokens(meta.tokens, types),
      normalizer: model.normalizer,
      pre_tokenizer: model.preTokenizer,
      post_processor: addBos && bosToken !== null ? bosTemplate(bosToken, bosId!) : null,
      decoder: model.decoder,
      model: model.model,
    },
    bos: bosId,
    eos: eosId,
    extraEosIds,
    addBos,
  };
}

interface ModelParts {
  model: object;
  normalizer: object | null;
  preTokenizer: object | null;
  decoder: object;
}

function unsupported(model: string, file: string): never {
  throw new Error(
    `${file}: GGUF tokenizer model ${quote(model)} (tokenizer.ggml.model) is not supported; supported: ${GGUF_TOKENIZER_MODELS.map((m) => JSON.stringify(m)).join(", ")}`,
  );
}

function vocabOf(tokens: readonly string[]): Record<string, number> {
  const vocab: Record<string, number> = {};
  // Duplicate strings happen (padding tokens); the first id keeps the string, as llama.cpp's map does.
  tokens.forEach((t, id) => {
    if (!Object.hasOwn(vocab, t)) vocab[t] = id;
  });
  return vocab;
}

function bpeModel(meta: GgufTokenizerMeta, file: string): ModelParts {
  if (!meta.merges) throw new Error(`${file}: tokenizer.ggml.model "gpt2" needs tokenizer.ggml.merges`);
  const pre = PRE_TOKENIZERS[meta.pre ?? "default"];
  if (!pre) {
    throw new Error(
      `${file}: GGUF pre-tokenizer ${quote(meta.pre)} (tokenizer.ggml.pre) is not supported; supported: ${Object.keys(PRE_TOKENIZERS).join(", ")}`,
    );
  }
  return {
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: pre.ignoreMerges,
      vocab: vocabOf(meta.tokens),
      merges: meta.merges.slice(),
    },
    normalizer: null,
    preTokenizer: pre.pre,
    decoder: byteLevel(true),
  };
}

function spmModel(meta: GgufTokenizerMeta, file: string, types: ArrayLike<number>): ModelParts {
  if (!meta.scores) throw new Error(`${file}: tokenizer.ggml.model "llama" needs tokenizer.ggml.scores`);
  const unk = meta.unknownId ?? meta.tokens.indexOf("<unk>");
  // llama.cpp prepends ▁ to SentencePiece text unless tokenizer.ggml.add_space_prefix is false,
  // and then has no space to take off the first word when decoding either.
  const spacePrefix = meta.addSpacePrefix ?? true;
  return {
    model: {
      type: "BPE",
      dropout: null,
      unk_token: unk >= 0 ? meta.tokens[unk] : null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab: vocabOf(meta.tokens),
      merges: meta.merges ? meta.merges.slice() : spmMerges(meta.tokens, meta.scores, types),
    },
    normalizer: {
      type: "Sequence",
      normalizers: [...(spacePrefix ? [{ type: "Prepend", prepend: "▁" }] : []), { type: "Replace", pattern: { String: " " }, content: "▁" }],
    },
    preTokenizer: null,
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        ...(spacePrefix ? [{ type: "Strip", content: " ", start: 1, stop: 0 }] : []),
      ],
    },
  };
}

/**
 * SentencePiece BPE merges the adjacent pair whose joined piece scores highest; BPE merges the
 * pair of lowest rank. So every split of a normal piece into two pieces of the vocabulary is a
 * merge, ranked by the joined piece's score (ties: lower id first, then the left part's id).
 */
export function spmMerges(tokens: readonly string[], scores: ArrayLike<number>, types: ArrayLike<number>): string[][] {
  const vocab = new Map<string, number>();
  tokens.forEach((t, id) => {
    if (types[id] === TokenType.normal && !vocab.has(t)) vocab.set(t, id);
  });
  const found: { left: string; right: string; score: number; id: number; leftId: number }[] = [];
  for (const [piece, id] of vocab) {
    const chars = Array.from(piece);
    for (let i = 1; i < chars.length; i++) {
      const left = chars.slice(0, i).join("");
      const right = chars.slice(i).join("");
      const leftId = vocab.get(left);
      if (leftId !== undefined && vocab.has(right)) found.push({ left, right, score: scores[id]!, id, leftId });
    }
  }
  found.sort((a, b) => b.score - a.score || a.id - b.id || a.leftId - b.leftId);
  return found.map((m) => [m.left, m.right]);
}

function addedTokens(tokens: readonly string[], types: ArrayLike<number>): object[] {
  const out: object[] = [];
  for (let id = 0; id < tokens.length; id++) {
    const t = types[id];
    if (t !== TokenType.control && t !== TokenType.userDefined && t !== TokenType.unknown) continue;
    out.push({ id, content: tokens[id], single_word: false, lstrip: false, rstrip: false, normalized: false, special: t !== TokenType.userDefined });
  }
  return out;
}

function bosTemplate(bosToken: string, bosId: number): object {
  return {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: bosToken, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: bosToken, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { [bosToken]: { id: bosToken, ids: [bosId], tokens: [bosToken] } },
  };
}
