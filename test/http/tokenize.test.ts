// POST /tokenize and /detokenize as vLLM defines them, on engines and on the gateway; the gateway
// serves them for a vocabulary-only GGUF of any architecture (llama.cpp's ggml-vocab-*.gguf).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { REPO } from "../cli/procs.ts";
import { type Gateway, startGateway } from "../../src/gateway/index.ts";
import { chatRendererFor } from "../../src/tokenizer/index.ts";
import { loadModel, loadTokenizerFor } from "../../src/model/index.ts";
import { fakeServedModel, GATEWAY_TUNING } from "../support/nodes.ts";
import { byteLevelGgufMeta, vocabOnlyGguf } from "../support/tokenizer-files.ts";

let engine: EngineNode;
let gateway: Gateway;
let vocabFile: string;
const stops: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  engine = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 16, numBlocks: 64, maxModelLen: 64 });
  stops.push(() => engine.shutdown());
  // A vocabulary llama.cpp would call "falcon": no tensors, an architecture no engine here runs.
  vocabFile = join(mkdtempSync(join(tmpdir(), "tl-vocab-")), "ggml-vocab-falcon.gguf");
  writeFileSync(vocabFile, vocabOnlyGguf({ ...byteLevelGgufMeta({ pre: "qwen2", bos: false }), pre: "falcon" }, "falcon"));
  const m = await loadTokenizerFor({ modelPath: vocabFile });
  gateway = await startGateway({
    ...GATEWAY_TUNING,
    tokenizer: m.tokenizer,
    chat: chatRendererFor(m.tokenizer, m.chatTemplate),
    modelName: m.name,
    maxModelLen: Math.min(128, m.maxSeqLen),
  });
  stops.push(() => gateway.stop());
});
afterAll(async () => {
  for (const s of stops.reverse()) await s();
});

async function post(address: string, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown>; headers: Headers }> {
  const r = await fetch(`http://${address}${path}`, { method: "POST", body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as Record<string, unknown>, headers: r.headers };
}

describe("engine /tokenize and /detokenize", () => {
  test("prompt with and without special tokens", async () => {
    const a = engine.httpAddress;
    // The byte tokenizer: BOS 256, then the UTF-8 bytes.
    expect((await post(a, "/tokenize", { model: "fake", prompt: "Hi" })).json).toEqual({ tokens: [256, 72, 105], count: 3, max_model_len: 64 });
    expect((await post(a, "/tokenize", { prompt: "Hi", add_special_tokens: false })).json).toEqual({ tokens: [72, 105], count: 2, max_model_len: 64 });
    expect((await post(a, "/detokenize", { model: "fake", tokens: [256, 72, 105] })).json).toEqual({ prompt: "Hi" });
  });

  test("messages are the chat prompt", async () => {
    const messages = [{ role: "user", content: "Hi" }];
    const r = await post(engine.httpAddress, "/tokenize", { messages });
    const text = "<|user|>\nHi\n<|assistant|>\n";
    expect(r.json.tokens).toEqual([256, ...new TextEncoder().encode(text)]);
    expect(r.json.count).toBe(text.length + 1);
  });

  test("bad input is 400 before any work", async () => {
    const a = engine.httpAddress;
    const cases: [string, unknown, number, string][] = [
      ["/tokenize", "{", 400, "not valid JSON"],
      ["/tokenize", [1], 400, "JSON object"],
      ["/tokenize", {}, 400, "exactly one of prompt"],
      ["/tokenize", { prompt: "a", messages: [] }, 400, "exactly one of prompt"],
      ["/tokenize", { prompt: [1, 2] }, 400, "prompt must be a string"],
      ["/tokenize", { prompt: "a", add_special_tokens: "yes" }, 400, "add_special_tokens must be a boolean"],
      ["/tokenize", { prompt: "x".repeat(64 * 64 + 1) }, 400, "longer than the context"],
      ["/tokenize", { messages: [{ role: "wizard", content: "x" }] }, 400, "role"],
      ["/tokenize", { prompt: "a", return_token_strs: true }, 400, "return_token_strs is not supported"],
      ["/tokenize", { prompt: "a", model: "other" }, 404, "not served here"],
      ["/detokenize", { tokens: "1" }, 400, "tokens must be an array"],
      ["/detokenize", { tokens: [1, 258] }, 400, "not a token id in 0..257"],
      ["/detokenize", { tokens: [1.5] }, 400, "not a token id"],
      ["/detokenize", { tokens: new Array(65).fill(1) }, 400, "at most max_model_len (64)"],
    ];
    for (const [path, body, status, msg] of cases) {
      const r = await post(a, path, body);
      expect([path, r.status]).toEqual([path, status]);
      expect((r.json.error as { message: string }).message).toContain(msg);
    }
  });

  test("unknown fields served and named", async () => {
    const r = await post(engine.httpAddress, "/tokenize", { prompt: "a", add_special_tokens: false, __proto__x: 1, constructor: 2 });
    expect(r.status).toBe(200);
    expect(r.headers.get("x-tl-ignored-fields")).toBe("__proto__x,constructor");
  });
});

describe("gateway /tokenize on a vocabulary-only GGUF", () => {
  test("gateway serves a falcon vocabulary", async () => {
    const a = gateway.httpAddress;
    const r = await post(a, "/tokenize", { prompt: "hello world 12345" });
    expect(r.status).toBe(200);
    const tokens = r.json.tokens as number[];
    expect(r.json.count).toBe(tokens.length);
    expect(r.json.max_model_len).toBe(128);
    expect((await post(a, "/detokenize", { tokens })).json).toEqual({ prompt: "hello world 12345" });
    // Falcon's split cuts ASCII digits in threes: "123" and "45", never the fixture's "1 2" merge across.
    const pieces = tokens.map(async (t) => (await post(a, "/detokenize", { tokens: [t] })).json.prompt);
    expect((await Promise.all(pieces)).join("|")).toContain("123|4|5");
  });

  test("gateway asks for max model len when the file states no context", async () => {
    // The fixture has no falcon.context_length: the gateway cannot guess a context, so it stops with exit 2.
    const args = ["--role", "gateway", "--model", vocabFile, "--http-listen", "127.0.0.1:0", "--registry-listen", "127.0.0.1:0"];
    const p = Bun.spawn([process.execPath, "bin/engine.ts", ...args], { cwd: REPO, stdout: "pipe", stderr: "pipe" });
    const [code, err] = [await p.exited, await new Response(p.stderr).text()];
    expect(code).toBe(2);
    expect(err).toContain("ggml-vocab-falcon states no context length: give [gateway] max_model_len (--max-model-len)");
  }, 20_000);

  test("engines still refuse the architecture", async () => {
    await expect(loadModel({ modelPath: vocabFile })).rejects.toThrow(/general.architecture "falcon" is not supported/);
  });
});
