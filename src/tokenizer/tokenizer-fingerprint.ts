import { createHash } from "node:crypto";
import type { Tokenizer } from "./tokenizer.ts";

/** Text whose ids differ between tokenizers that share pieces but not merges or pre-tokenizers. */
const PROBE = "Hello, world! It's 2025: 12345 tokens\n\n  indented\tcode() {}; naïve café 世界 😀 <|im_start|><|eot_id|><s></s>";

/**
 * A short digest of how a tokenizer maps text to ids and back: two processes (a gateway and its
 * engines) that must hash the same prompt blocks compare these rather than trust that the same
 * model name means the same tokens. Covers every piece's bytes, the special ids, BOS policy, and
 * the ids of a probe text (merges and pre-tokenizer).
 *
 * The chat template is deliberately not in it: the gateway renders chat prompts with its own
 * template and sends engines token ids (P's Prefill and D's resume are token-id completions), so
 * an engine's template never touches gateway traffic and an engine with another one serves it
 * exactly; refusing it would only turn away a working engine. What must agree is the tokenizer
 * (the gateway's own chat prompt is tokenized by it and the engine decodes and stops on its ids).
 */
export function tokenizerFingerprint(tokenizer: Tokenizer): string {
  const h = createHash("sha256");
  const u32 = new Uint32Array(1);
  const int = (n: number) => {
    u32[0] = n >>> 0;
    h.update(u32);
  };
  int(tokenizer.vocabSize);
  int(tokenizer.bos);
  int(tokenizer.eos);
  int(tokenizer.addBos ? 1 : 0);
  for (const id of tokenizer.eosIds) int(id);
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    const p = tokenizer.pieceBytes(id, 0);
    int(p.length);
    h.update(p);
  }
  for (const id of tokenizer.encode(PROBE)) int(id);
  return h.digest("hex").slice(0, 16);
}
