import { expect, test } from "bun:test";
import { parseCompletion } from "../../src/http/completion-request.ts";
import { HttpError } from "../../src/http/errors.ts";
import { ByteTokenizer } from "../../src/tokenizer/tokenizer.ts";

// A tokenizer that counts its work: a refused request must not have reached it.
class CountingTokenizer extends ByteTokenizer {
  encoded = 0;
  override encode(text: string): number[] {
    this.encoded += text.length;
    return super.encode(text);
  }
}

function refusal(kind: "completion" | "chat", body: unknown, tok: CountingTokenizer) {
  try {
    parseCompletion(kind, body, { tokenizer: tok, maxModelLen: 128 });
  } catch (e) {
    return e as HttpError;
  }
  throw new Error("accepted");
}

test("oversized inputs are refused before tokenizing", () => {
  const tok = new CountingTokenizer();
  const cases: [kind: "completion" | "chat", body: unknown, says: RegExp][] = [
    ["completion", { prompt: "x".repeat(1 << 20) }, /prompt of 1048576 characters is longer than the context of 128 tokens/],
    ["completion", { prompt: ["y".repeat(1 << 20)] }, /prompt of 1048576 characters/],
    ["completion", { prompt: new Array(100_000).fill(1) }, /prompt of 100000 tokens exceeds the model's context of 128/],
    ["completion", { prompt: [new Array(100_000).fill(1)] }, /prompt of 100000 tokens/],
    ["chat", { messages: new Array(10_000).fill({ role: "user", content: "" }) }, /messages has 10000 entries/],
    ["chat", { messages: [{ role: "user", content: "z".repeat(1 << 20) }] }, /messages hold 1048576 characters/],
    ["chat", { messages: [{ role: "user", content: [{ type: "text", text: "z".repeat(1 << 20) }] }] }, /messages hold 1048576 characters/],
    ["completion", { prompt: "hi", stop: "s".repeat(1 << 20) }, /a stop sequence of 1048576 characters; at most 1024/],
    ["completion", { prompt: "hi", stop: new Array(1000).fill("a") }, /stop has 1000 sequences; at most 4/],
    ["completion", { prompt: "hi", stop_token_ids: new Array(100_000).fill(1) }, /stop_token_ids has 100000 entries; at most 256/],
  ];
  for (const [kind, body, says] of cases) {
    const e = refusal(kind, body, tok);
    expect(e).toBeInstanceOf(HttpError);
    expect(e.status).toBe(400);
    expect(e.message).toMatch(says);
  }
  expect(tok.encoded).toBe(0);
  // within the bounds: parsed as before
  const ok = parseCompletion("completion", { prompt: "hi", stop: ["a", "b"], stop_token_ids: [1, 2], max_tokens: 4 }, { tokenizer: tok, maxModelLen: 128 });
  expect(ok.promptTokens.length).toBeGreaterThan(0);
  expect(ok.stopTokenIds).toEqual([1, 2]);
});
