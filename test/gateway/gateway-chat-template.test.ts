import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ByteTokenizer, chatRendererFor } from "../../src/tokenizer/index.ts";
import { ChatTemplate } from "../../src/tokenizer/chat-template.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

const SMOLLM2 = readFileSync(new URL("../fixtures/chat-templates/smollm2-instruct.jinja", import.meta.url), "utf8");
let C: TestCluster;
beforeAll(async () => {
  const file = join(mkdtempSync(join(tmpdir(), "tl-gw-chat-")), "smollm2.jinja");
  writeFileSync(file, SMOLLM2);
  C = await startTestCluster({ prefill: 1, decode: 1, node: { chatTemplatePath: file }, gateway: { chat: chatRendererFor(new ByteTokenizer(), null, file) } });
});
afterAll(() => C?.stop());

describe("gateway chat templates", () => {
  test("gateway renders chat with the model template", async () => {
    const messages = [{ role: "user", content: "Hi there" }];
    const r = await fetch(`http://${C.gateway.httpAddress}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ messages, max_tokens: 4, temperature: 0 }),
    });
    expect(r.headers.get("x-tl-served")).toBe("disaggregated");
    const j = (await r.json()) as { usage: { prompt_tokens: number } };
    // The prompt the gateway hashed and P prefilled is SmolLM2's rendering (byte tokenizer: its UTF-8 length + BOS).
    const text = new ChatTemplate(SMOLLM2, {}).render(messages);
    expect(text.startsWith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")).toBe(true);
    expect(j.usage.prompt_tokens).toBe(new TextEncoder().encode(text).length + 1);
  });
});

describe("gateway and engines with different chat templates", () => {
  test("engine_template_never_touches_gateway_chat: registered, served with the gateway's rendering", async () => {
    // Engines keep the default template; only the gateway has SmolLM2's. Their tokenizers agree, so they register.
    const file = join(mkdtempSync(join(tmpdir(), "tl-gw-chat-")), "smollm2.jinja");
    writeFileSync(file, SMOLLM2);
    const c = await startTestCluster({ prefill: 1, decode: 1, gateway: { chat: chatRendererFor(new ByteTokenizer(), null, file) } });
    try {
      const messages = [{ role: "user", content: "Hi there" }];
      const body = JSON.stringify({ messages, max_tokens: 4, temperature: 0 });
      const r = await fetch(`http://${c.gateway.httpAddress}/v1/chat/completions`, { method: "POST", body });
      expect(r.headers.get("x-tl-served")).toBe("disaggregated");
      const viaGateway = ((await r.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
      expect(viaGateway).toBe(new TextEncoder().encode(new ChatTemplate(SMOLLM2, {}).render(messages)).length + 1);
      // The engine's own template renders another prompt: the gateway's tokens, not its template, reached it.
      const direct = await fetch(`http://${c.decode[0]!.httpAddress}/v1/chat/completions`, { method: "POST", body });
      expect(((await direct.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens).not.toBe(viaGateway);
    } finally {
      await c.stop();
    }
  });
});
