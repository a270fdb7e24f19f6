import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ByteTokenizer, ChatTemplate, chatRendererFor } from "../../src/model/index.ts";
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
  test("gateway_renders_chat_with_the_model_template", async () => {
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
