/**
 * Where a model's tokenizer and chat template come from, as its loader found them. The loaders
 * (llama2.c, Hugging Face folder, GGUF) only read files into this shape; turning it into a
 * Tokenizer and a template belongs to the tokenizer modules, so neither side knows the other's
 * file formats.
 */
export type TokenizerSource =
  | { kind: "byte" }
  | { kind: "llama2c"; path: string; vocabSize: number }
  | {
      kind: "hf";
      /** The model folder, for error messages. */
      dir: string;
      /** tokenizer.json, parsed. */
      tokenizerJson: unknown;
      /** tokenizer_config.json, parsed (chat_template, bos_token, eos_token, add_bos_token), or null. */
      tokenizerConfig: unknown;
      /** generation_config.json, parsed (eos_token_id may be a list), or null. */
      generationConfig: unknown;
      /** config.json's eos_token_id / bos_token_id, which some folders give only there. */
      configEosIds: readonly number[];
      configBosId: number | null;
      /** chat_template.jinja beside it (newer folders): wins over tokenizer_config's chat_template, as in transformers. */
      chatTemplateFile?: string | null;
      /** chat_template.json, parsed ({"chat_template": ...}, a processor's file): used only when neither of the above has one. */
      chatTemplateJson?: unknown;
    }
  | { kind: "gguf"; file: string; meta: GgufTokenizerMeta };

/** The `tokenizer.*` keys of a GGUF file, read by the GGUF loader. */
export interface GgufTokenizerMeta {
  /** tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE); others are refused by the tokenizer builder. */
  model: string;
  /** tokenizer.ggml.pre (pre-tokenizer name, e.g. "llama-bpe", "qwen2", "smollm"), if present. */
  pre: string | null;
  tokens: readonly string[];
  scores: ArrayLike<number> | null;
  tokenTypes: ArrayLike<number> | null;
  merges: readonly string[] | null;
  bosId: number | null;
  eosId: number | null;
  unknownId: number | null;
  paddingId: number | null;
  addBos: boolean | null;
  addEos: boolean | null;
  /** tokenizer.ggml.add_space_prefix: SentencePiece's ▁ before the text (llama.cpp's default: true for "llama"). */
  addSpacePrefix: boolean | null;
  /** tokenizer.chat_template, if present. */
  chatTemplate: string | null;
}
