import type { GgufTokenizerMeta } from "./tokenizer-source.ts";
import { quote } from "../codec/index.ts";

/** tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
const TokenType = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

/** The tokenizer.ggml.model values this engine maps onto tokenizer.json. */
export const GGUF_TOKENIZER_MODELS = ["llama", "gpt2"] as const;

const LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const byteLevel = (useRegex: boolean) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex });
const isolated = (regex: string) => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false });

/**
 * tokenizer.ggml.pre → the pre-tokenizer the model's tokenizer.json has, as llama.cpp groups the
 * names: GPT-2's split; Llama 3's (digits in threes); Qwen2's (single digits); SmolLM's (single
 * digits, then GPT-2's). `ignoreMerges`: a whole pre-token in the vocabulary is one token (Llama 3).
 */
const PRE_TOKENIZERS: Record<string, { pre: object; ignoreMerges: boolean }> = {
  default: { pre: byteLevel(true), ignoreMerges: false },
  "gpt-2": { pre: byteLevel(true), ignoreMerges: false },
  "llama-bpe": { pre: { type: "Sequence", pretokenizers: [isolated(LLAMA3_SPLIT), byteLevel(false)] }, ignoreMerges: true },
  "smaug-bpe": { pre: { type: "Sequence", pretokenizers: [isolated(LLAMA3_SPLIT), byteLevel(false)] }, ignoreMerges: true },
  qwen2: { pre: { type: "Sequence", pretokenizers: [isolated(QWEN2_SPLIT), byteLevel(false)] }, ignoreMerges: false },
  smollm: { pre: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] }, ignoreMerges: false },
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
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    preTokenizer: null,
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
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
