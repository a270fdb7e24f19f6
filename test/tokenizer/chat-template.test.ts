import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { buildTokenizer } from "../../src/tokenizer/build-tokenizer.ts";
import { ChatTemplate, chatRenderer, DEFAULT_CHAT_TEMPLATE, strftime, type ChatMessage } from "../../src/tokenizer/chat-template.ts";
import { ByteTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { byteLevelTokenizerJson } from "../support/tokenizer-files.ts";

const fixture = (name: string) => readFileSync(new URL(`../fixtures/chat-templates/${name}.jinja`, import.meta.url), "utf8");
const LLAMA32 = fixture("llama-3.2-instruct");
const QWEN25 = fixture("qwen2.5-instruct");
const SMOLLM2 = fixture("smollm2-instruct");
const LLAMA3_TOKENS = { bosToken: "<|begin_of_text|>", eosToken: "<|eot_id|>" };
const FEB_10 = () => new Date(2025, 1, 10, 12, 0, 0);

const CHAT: ChatMessage[] = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Hi" },
  { role: "assistant", content: "Hello!" },
  { role: "user", content: "Weather?" },
];
const TOOLS = [
  {
    type: "function",
    function: { name: "get_weather", description: "Weather now", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  },
];
const TOOL_HISTORY: ChatMessage[] = [
  { role: "user", content: "Weather in Oslo?" },
  { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Oslo"}' } }] },
  { role: "tool", tool_call_id: "call_1", content: '{"temp": 3}' },
];

describe("real chat templates", () => {
  test("llama3 2 template turns", () => {
    const t = new ChatTemplate(LLAMA32, LLAMA3_TOKENS);
    const head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 10 Feb 2025\n\n";
    const turns =
      "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
      "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>";
    expect(t.render(CHAT, { now: FEB_10 })).toBe(head + turns + "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect(t.render(CHAT, { now: FEB_10, addGenerationPrompt: false })).toBe(head + turns);
    // No system message: an empty one, still with the dates.
    expect(t.render([{ role: "user", content: "Hi" }], { now: FEB_10 })).toBe(
      head + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
  });

  test("llama3 2 template tool call history", () => {
    const t = new ChatTemplate(LLAMA32, LLAMA3_TOKENS);
    const tool = JSON.stringify(TOOLS[0], null, 4);
    expect(t.render(TOOL_HISTORY, { tools: TOOLS, now: FEB_10 })).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 10 Feb 2025\n\n<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' +
        tool +
        "\n\nWeather in Oslo?<|eot_id|>" +
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>' +
        // A string is iterable in Jinja: the template JSON-quotes tool output, as transformers renders it.
        '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 3}"<|eot_id|>' +
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    );
  });

  test("llama3 2 template raise exception", () => {
    const t = new ChatTemplate(LLAMA32, LLAMA3_TOKENS, "/models/llama chat template");
    const call = TOOL_HISTORY[1]!.tool_calls as unknown[];
    const two: ChatMessage[] = [TOOL_HISTORY[0]!, { role: "assistant", content: null, tool_calls: [call[0], call[0]] }];
    expect(() => t.render(two)).toThrow("/models/llama chat template refused the conversation: This model only supports single tool-calls at once!");
  });

  test("qwen2 5 template turns", () => {
    const t = new ChatTemplate(QWEN25, { eosToken: "<|im_end|>" });
    expect(t.render(CHAT)).toBe(
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n",
    );
    // Without a system message Qwen's own default one is written.
    expect(t.render([{ role: "user", content: "Hi" }], { addGenerationPrompt: false })).toBe(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    );
  });

  test("qwen2 5 template tool call history", () => {
    const t = new ChatTemplate(QWEN25, { eosToken: "<|im_end|>" });
    expect(t.render(TOOL_HISTORY, { tools: TOOLS })).toBe(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
        JSON.stringify(TOOLS[0]).replaceAll('":', '": ').replaceAll(',"', ', "') +
        '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n" +
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\n<tool_response>\n{"temp": 3}\n</tool_response><|im_end|>\n' +
        "<|im_start|>assistant\n",
    );
  });

  test("smollm2 template turns", () => {
    const t = new ChatTemplate(SMOLLM2, { bosToken: "<|im_start|>", eosToken: "<|im_end|>" });
    expect(t.render(CHAT)).toBe(
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n",
    );
    expect(t.render([{ role: "user", content: "Hi" }], { addGenerationPrompt: false })).toBe(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    );
  });

  test("strftime english names", () => {
    expect(strftime(new Date(2024, 6, 26, 9, 5, 3), "%d %b %Y|%B %A %a|%H:%M:%S|%m/%y|100%%")).toBe("26 Jul 2024|July Friday Fri|09:05:03|07/24|100%");
  });
});

describe("chat prompts as token ids", () => {
  test("default chat template", () => {
    const tok = new ByteTokenizer();
    const r = chatRenderer(tok, null);
    const ids = r.promptTokens([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
    ]);
    expect(ids).toEqual(tok.encode("<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"));
    expect(new ChatTemplate(DEFAULT_CHAT_TEMPLATE, {}).render([{ role: "user", content: "x" }], { addGenerationPrompt: false })).toBe("<|user|>\nx\n");
  });

  test("template bos not doubled", async () => {
    const { json } = byteLevelTokenizerJson({ pre: "llama-bpe", bos: true });
    const { tokenizer } = await buildTokenizer({
      kind: "hf",
      dir: "/m",
      tokenizerJson: json,
      tokenizerConfig: { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>", add_bos_token: true },
      generationConfig: null,
      configEosIds: [],
      configBosId: null,
    });
    const withBos = chatRenderer(tokenizer, LLAMA32).promptTokens(CHAT);
    expect(withBos[0]).toBe(tokenizer.bos);
    expect(withBos[1]).not.toBe(tokenizer.bos);
    expect(withBos.filter((id) => id === tokenizer.bos).length).toBe(1);
    // A template without the BOS text still gets BOS first, once.
    const plain = chatRenderer(tokenizer, SMOLLM2).promptTokens(CHAT);
    expect(plain[0]).toBe(tokenizer.bos);
    expect(plain.filter((id) => id === tokenizer.bos).length).toBe(1);
  });

  test("chat template parse error refused", () => {
    expect(() => chatRenderer(new ByteTokenizer(), "{% for m in messages %}", "/tmp/t.jinja")).toThrow(/^\/tmp\/t\.jinja does not parse: /);
  });
});
