import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { parseArgs } from "../../src/cli/options.ts";
import { ChatTemplate } from "../../src/tokenizer/chat-template.ts";
import { fakeServedModel } from "../support/nodes.ts";

const QWEN25 = readFileSync(new URL("../fixtures/chat-templates/qwen2.5-instruct.jinja", import.meta.url), "utf8");
const LLAMA32 = readFileSync(new URL("../fixtures/chat-templates/llama-3.2-instruct.jinja", import.meta.url), "utf8");
const nodes: EngineNode[] = [];
afterAll(async () => {
  for (const n of nodes) await n.shutdown();
});

async function node(
  chatTemplate: string | null,
  chatTemplatePath?: string,
): Promise<(body: unknown) => Promise<{ status: number; json: Record<string, any> }>> {
  const n = await startEngineNode({
    role: "both",
    model: { ...fakeServedModel(), maxSeqLen: 2048, chatTemplate },
    chatTemplatePath,
    blockTokens: 16,
    numBlocks: 256,
    maxModelLen: 2048,
  });
  nodes.push(n);
  return async (body) => {
    const r = await fetch(`http://${n.httpAddress}/v1/chat/completions`, { method: "POST", body: JSON.stringify(body) });
    return { status: r.status, json: (await r.json()) as Record<string, any> };
  };
}

const utf8Len = (s: string) => new TextEncoder().encode(s).length;
const TOOLS = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const HISTORY = [
  { role: "user", content: "Weather in Oslo?" },
  { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] },
  { role: "tool", tool_call_id: "call_1", content: "3 C" },
];

describe("chat requests through the model's template", () => {
  test("model template renders tool call history", async () => {
    const chat = await node(QWEN25);
    const r = await chat({ messages: HISTORY, max_tokens: 2 });
    expect({ status: r.status, error: r.json.error }).toEqual({ status: 200, error: undefined });
    // With `tools` the template renders them too (tool_choice "none": the output stays text).
    const withTools = await chat({ messages: HISTORY, tools: TOOLS, tool_choice: "none", max_tokens: 2 });
    expect(withTools.status).toBe(200);
    const wantTools = new ChatTemplate(QWEN25, {}).render(
      HISTORY.map((m) => ({ ...m })),
      { tools: TOOLS },
    );
    expect(wantTools).toContain('"name": "get_weather"');
    expect(withTools.json.usage.prompt_tokens).toBe(utf8Len(wantTools) + 1);
    // The byte tokenizer makes the prompt's length its rendered text's UTF-8 length, plus BOS.
    const want = new ChatTemplate(QWEN25, {}).render(
      HISTORY.map((m) => ({ ...m })),
      {},
    );
    expect(want).toContain('{"name": "get_weather", "arguments": {"city": "Oslo"}}');
    expect(want).toContain("<tool_response>\n3 C\n</tool_response>");
    expect(r.json.usage.prompt_tokens).toBe(utf8Len(want) + 1);
  });

  test("template raise exception is a 400", async () => {
    const chat = await node(LLAMA32);
    const call = HISTORY[1]!.tool_calls![0];
    const r = await chat({ messages: [HISTORY[0], { role: "assistant", content: null, tool_calls: [call, call] }], max_tokens: 2 });
    expect(r.status).toBe(400);
    expect(r.json.error.message).toBe("the model's chat template refused the conversation: This model only supports single tool-calls at once!");
    const bad = await chat({ messages: [{ role: "user", content: "x", tool_calls: [] }], max_tokens: 2 });
    expect(bad.status).toBe(400);
    expect(bad.json.error.message).toBe("messages[0].tool_calls must be an array on an assistant message");
    const tools = await chat({ messages: [{ role: "user", content: "x" }], tools: "all", max_tokens: 2 });
    expect(tools.json.error.message).toBe("tools must be an array of objects");
  });

  test("chat template file overrides the model template", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tl-chat-"));
    const file = join(dir, "t.jinja");
    writeFileSync(file, "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}");
    const chat = await node(QWEN25, file);
    const r = await chat({ messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
    expect(r.json.usage.prompt_tokens).toBe(utf8Len("[user]hi[assistant]") + 1);
    await expect(node(null, join(dir, "missing.jinja"))).rejects.toThrow(`chat template ${join(dir, "missing.jinja")} cannot be read`);
    writeFileSync(file, "{% if %}");
    await expect(node(null, file)).rejects.toThrow(`chat template ${file} does not parse`);
    const cfg = parseArgs(["--chat-template", file]).config;
    expect(cfg.engine.chat_template).toBe(file);
    expect(parseArgs(["--role", "gateway", "--chat-template", file]).config.gateway.chat_template).toBe(file);
  });

  test("no template gets the default", async () => {
    const chat = await node(null);
    const r = await chat({
      messages: [
        { role: "system", content: "s" },
        { role: "user", content: "hi" },
      ],
      max_tokens: 2,
    });
    expect(r.json.usage.prompt_tokens).toBe(utf8Len("<|system|>\ns\n<|user|>\nhi\n<|assistant|>\n") + 1);
  });
});
