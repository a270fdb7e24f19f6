// Small tokenizer.json files shaped like real ones (Qwen2.5 / Llama 3 / SmolLM2 byte-level BPE,
// Llama 2 / TinyLlama SentencePiece BPE), and the GGUF metadata llama.cpp's converter would write
// for the same vocabularies. Tests write them; nothing is downloaded.
import { BYTE_TO_CHAR } from "../../src/tokenizer/byte-level.ts";
import type { GgufTokenizerMeta } from "../../src/tokenizer/tokenizer-source.ts";
import { encodeGguf, type GgufKv, GT } from "./model-writers.ts";

const added = (id: number, content: string, special = true) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
const bl = (s: string) => Array.from(new TextEncoder().encode(s), (b) => BYTE_TO_CHAR[b]!).join("");

/** The pre-tokenizers as the real tokenizer.json files spell them. */
export const REAL_PRE_TOKENIZERS = {
  qwen2: {
    type: "Sequence",
    pretokenizers: [
      {
        type: "Split",
        pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
        behavior: "Isolated",
        invert: false,
      },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  },
  "llama-bpe": {
    type: "Sequence",
    pretokenizers: [
      {
        type: "Split",
        pattern: {
          Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        },
        behavior: "Isolated",
        invert: false,
      },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  smollm: {
    type: "Sequence",
    pretokenizers: [
      { type: "Digits", individual_digits: true },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    ],
  },
} as const;

const EMOJI = bl("😀");
/**
 * Merges of the byte-level vocabulary, by rank: " ð" first, so " 😀" splits inside the emoji as
 * [" \xF0", "\x9F", "\x98\x80"], while "😀" alone becomes one token; then English words and digits.
 */
const BPE_MERGES: [string, string][] = [
  ["Ġ", "ð"],
  [EMOJI[0]!, EMOJI[1]!],
  [EMOJI[2]!, EMOJI[3]!],
  [EMOJI.slice(0, 2), EMOJI.slice(2)],
  ["Ġ", "w"],
  ["o", "r"],
  ["Ġw", "or"],
  ["l", "d"],
  ["Ġwor", "ld"],
  ["h", "e"],
  ["l", "l"],
  ["he", "ll"],
  ["hell", "o"],
  ["Ġ", "h"],
  ["1", "2"],
  ["12", "3"],
];

/** tokenizer.json's model.vocab: each token's id is its index (these fixtures hold no duplicates). */
function idsOf(tokens: readonly string[]): Record<string, number> {
  return Object.fromEntries(tokens.map((t, i) => [t, i]));
}

export interface ByteLevelOptions {
  pre: keyof typeof REAL_PRE_TOKENIZERS;
  /** Llama 3 style: BOS <|begin_of_text|> added by the post-processor. */
  bos: boolean;
}

/** A byte-level BPE tokenizer.json; ids: 256 bytes, then merges in order, then the special tokens. */
export function byteLevelTokenizerJson(opts: ByteLevelOptions): { json: object; tokens: string[]; merges: string[]; special: string[] } {
  const tokens = BYTE_TO_CHAR.slice();
  const merges = BPE_MERGES;
  for (const [a, b] of merges) if (!tokens.includes(a + b)) tokens.push(a + b);
  const special = opts.bos ? ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] : ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
  const first = tokens.length;
  tokens.push(...special);
  const vocab = idsOf(tokens);
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: special.map((s, i) => added(first + i, s)),
    normalizer: null,
    pre_tokenizer: REAL_PRE_TOKENIZERS[opts.pre],
    post_processor: opts.bos
      ? {
          type: "TemplateProcessing",
          single: [{ SpecialToken: { id: special[0], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: special[0], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { [special[0]!]: { id: special[0], ids: [first], tokens: [special[0]] } },
        }
      : { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: opts.pre === "llama-bpe",
      vocab,
      merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  return { json, tokens, merges: merges.map(([a, b]) => `${a} ${b}`), special };
}

/** What convert_hf_to_gguf writes for that vocabulary: special tokens are CONTROL (3), the rest NORMAL (1). */
export function byteLevelGgufMeta(opts: ByteLevelOptions): GgufTokenizerMeta {
  const { tokens, merges, special } = byteLevelTokenizerJson(opts);
  const types = tokens.map((t) => (special.includes(t) ? 3 : 1));
  const id = (t: string) => tokens.indexOf(t);
  return {
    model: "gpt2",
    pre: opts.pre,
    tokens,
    scores: null,
    tokenTypes: types,
    merges,
    bosId: opts.bos ? id("<|begin_of_text|>") : id("<|endoftext|>"),
    eosId: opts.bos ? id("<|eot_id|>") : id("<|im_end|>"),
    unknownId: null,
    paddingId: null,
    addBos: opts.bos,
    addEos: false,
    addSpacePrefix: null,
    chatTemplate: null,
  };
}

/** SentencePiece merges, best first; every joined piece has exactly one split in the vocabulary. */
const SPM_MERGES: [string, string][] = [
  ["l", "l"],
  ["▁", "h"],
  ["▁h", "e"],
  ["▁he", "ll"],
  ["▁hell", "o"],
  ["▁", "w"],
  ["o", "r"],
  ["▁w", "or"],
  ["▁wor", "l"],
  ["▁worl", "d"],
  ["▁", "H"],
];
const SPM_CHARS = ["▁", "h", "e", "l", "o", "w", "r", "d", "H", "i", "!", "世"];

/** A Llama 2 / TinyLlama style tokenizer.json: <unk> <s> </s>, 256 <0xXX> byte pieces, characters, merged pieces. */
export function spmTokenizerJson(): { json: object; tokens: string[]; scores: number[]; types: number[] } {
  const tokens = ["<unk>", "<s>", "</s>"];
  const types = [2, 3, 3];
  const scores = [0, 0, 0];
  for (let b = 0; b < 256; b++) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    types.push(6);
    scores.push(0);
  }
  SPM_MERGES.forEach(([a, b], i) => {
    tokens.push(a + b);
    types.push(1);
    scores.push(-i);
  });
  SPM_CHARS.forEach((c, i) => {
    tokens.push(c);
    types.push(1);
    scores.push(-1000 - i);
  });
  const vocab = idsOf(tokens);
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: "<unk>",
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab,
      merges: SPM_MERGES.map(([a, b]) => `${a} ${b}`),
    },
  };
  return { json, tokens, scores, types };
}

/** The GGUF metadata of the same SentencePiece vocabulary: tokens, scores and types, no merges. */
export function spmGgufMeta(): GgufTokenizerMeta {
  const { tokens, scores, types } = spmTokenizerJson();
  return {
    model: "llama",
    pre: null,
    tokens,
    scores,
    tokenTypes: types,
    merges: null,
    bosId: 1,
    eosId: 2,
    unknownId: 0,
    paddingId: null,
    addBos: true,
    addEos: false,
    addSpacePrefix: null,
    chatTemplate: null,
  };
}

/**
 * A vocabulary-only GGUF file, as llama.cpp's models/ggml-vocab-*.gguf are: `general.architecture`
 * and the tokenizer.* keys of `meta`, no tensors. `extra` adds keys (add_space_prefix...).
 */
export function vocabOnlyGguf(meta: GgufTokenizerMeta, arch: string, extra: GgufKv[] = []): Uint8Array {
  const kvs: GgufKv[] = [
    ["general.architecture", GT.str, arch],
    ["general.name", GT.str, `vocab-${arch}`],
    ["tokenizer.ggml.model", GT.str, meta.model],
    ["tokenizer.ggml.tokens", GT.arr, [GT.str, meta.tokens]],
  ];
  if (meta.pre !== null) kvs.push(["tokenizer.ggml.pre", GT.str, meta.pre]);
  if (meta.scores) kvs.push(["tokenizer.ggml.scores", GT.arr, [GT.f32, Array.from(meta.scores)]]);
  if (meta.tokenTypes) kvs.push(["tokenizer.ggml.token_type", GT.arr, [GT.i32, Array.from(meta.tokenTypes)]]);
  if (meta.merges) kvs.push(["tokenizer.ggml.merges", GT.arr, [GT.str, meta.merges]]);
  const ids: [string, number | null][] = [
    ["bos_token_id", meta.bosId],
    ["eos_token_id", meta.eosId],
    ["unknown_token_id", meta.unknownId],
    ["padding_token_id", meta.paddingId],
  ];
  for (const [k, v] of ids) if (v !== null) kvs.push([`tokenizer.ggml.${k}`, GT.u32, v]);
  if (meta.addBos !== null) kvs.push(["tokenizer.ggml.add_bos_token", GT.bool, meta.addBos]);
  if (meta.addEos !== null) kvs.push(["tokenizer.ggml.add_eos_token", GT.bool, meta.addEos]);
  if (meta.addSpacePrefix !== null) kvs.push(["tokenizer.ggml.add_space_prefix", GT.bool, meta.addSpacePrefix]);
  return encodeGguf([...kvs, ...extra], []);
}
