// src/tokenizer: text <-> token ids and chat rendering (floor 1; imports only codec). What other rooms use.
export { buildTokenizer } from "./build-tokenizer.ts";
export { type ChatMessage, chatRenderer, type ChatRenderer, chatRendererFor, ChatTemplateError } from "./chat-template.ts";
export { grammarVocab } from "./grammar-vocab.ts";
export { loadLlama2cTokenizer } from "./llama2c-tokenizer.ts";
export { tokenizerFingerprint } from "./tokenizer-fingerprint.ts";
export type { GgufTokenizerMeta, TokenizerSource } from "./tokenizer-source.ts";
export { ByteTokenizer, StreamDecoder, type Tokenizer } from "./tokenizer.ts";
