import { loadLlama2cTokenizer } from "./llama2c.ts";
import type { TokenizerSource } from "./tokenizer-source.ts";
import { ByteTokenizer, type Tokenizer } from "./tokenizer.ts";

/**
 * The tokenizer and chat template a loader's TokenizerSource describes. This version builds the
 * byte and llama2.c tokenizers only; the tokenizer work (tokenizer.json and GGUF vocabularies,
 * chat templates) replaces this file with the full builder behind the same signature.
 */
export async function buildTokenizer(src: TokenizerSource): Promise<{ tokenizer: Tokenizer; chatTemplate: string | null }> {
  switch (src.kind) {
    case "byte":
      return { tokenizer: new ByteTokenizer(), chatTemplate: null };
    case "llama2c":
      return { tokenizer: loadLlama2cTokenizer(src.path, src.vocabSize), chatTemplate: null };
    case "hf":
    case "gguf":
      throw new Error(`tokenizer kind ${src.kind}: not built yet`);
  }
}
