import { BYTE_TO_CHAR } from "./byte-level.ts";
import type { Tokenizer } from "./tokenizer.ts";

/**
 * The vocabulary as a grammar backend reads it (src/grammar's GrammarVocab): each of the
 * model's `vocabSize` token ids as the bytes it adds to the text, spelled in GPT-2's
 * byte-level alphabet whatever the tokenizer's own scheme, so a piece holding part of a UTF-8
 * character keeps its bytes; tokens that add no text (BOS, EOS, other specials, padded rows
 * past the tokenizer) are "". The pieces are read mid-text (`prev` neither -1 nor BOS), where
 * no tokenizer drops a leading space. Stop ids: the tokenizer's EOS ids.
 */
export function grammarVocab(tokenizer: Tokenizer, vocabSize = tokenizer.vocabSize): { encoded: string[]; stopIds: number[] } {
  const encoded: string[] = new Array(vocabSize);
  const midText = -2;
  for (let id = 0; id < vocabSize; id++) {
    if (id >= tokenizer.vocabSize) {
      encoded[id] = "";
      continue;
    }
    const bytes = tokenizer.pieceBytes(id, midText);
    let s = "";
    for (let i = 0; i < bytes.length; i++) s += BYTE_TO_CHAR[bytes[i]!];
    encoded[id] = s;
  }
  return { encoded, stopIds: tokenizer.eosIds.filter((id) => id < vocabSize) };
}
