import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadModel, startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { parseToolCalls, parseTools, type ToolPlan } from "../../src/http/index.ts";
import { schemaViolation } from "../support/schema-check.ts";
import { sseEvents } from "../support/nodes.ts";

const WEATHER = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
  required: ["city", "unit"],
  additionalProperties: false,
};
const VERSE = {
  type: "object",
  properties: { book: { type: "string", enum: ["Genesis", "Exodus"] }, chapter: { type: "integer", minimum: 1, maximum: 50 } },
  required: ["book", "chapter"],
  additionalProperties: false,
};
const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: WEATHER } },
  { type: "function", function: { name: "find_verse", parameters: VERSE } },
];
const SCHEMAS: Record<string, unknown> = { get_weather: WEATHER, find_verse: VERSE };

// Real outputs of Qwen2.5-Instruct (Hermes form) and Llama 3.1/3.2-Instruct (JSON form), as text.
const HERMES_ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>';
const HERMES_TWO =
  'I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "find_verse", "arguments": {"book": "Exodus", "chapter": 3}}\n</tool_call>';
const LLAMA3 = '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}';
const LLAMA3_TAGGED = '<|python_tag|>{"name": "find_verse", "parameters": {"book": "Genesis", "chapter": 1}}';

const plan = (parser: "hermes" | "llama3_json", choice: unknown = "auto"): ToolPlan => parseTools({ tools: TOOLS, tool_choice: choice }, parser)!;

describe("auto: the model's tool-call syntax parsed into tool_calls", () => {
  test("Hermes / Qwen2.5: one call, two calls with text before, text only, a broken call", () => {
    expect(parseToolCalls(plan("hermes"), HERMES_ONE)).toEqual({
      content: null,
      calls: [{ name: "get_weather", arguments: '{"city":"Oslo","unit":"celsius"}' }],
    });
    expect(parseToolCalls(plan("hermes"), HERMES_TWO)).toEqual({
      content: "I will look both up.",
      calls: [
        { name: "get_weather", arguments: '{"city":"Oslo","unit":"celsius"}' },
        { name: "find_verse", arguments: '{"book":"Exodus","chapter":3}' },
      ],
    });
    expect(parseToolCalls(plan("hermes"), "In the beginning.")).toBeNull();
    expect(parseToolCalls(plan("hermes"), '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>')).toBeNull();
    expect(parseToolCalls(plan("hermes"), '<tool_call>{"name": "launch", "arguments": {}}</tool_call>')).toBeNull();
  });

  test("Llama 3 JSON: parameters, <|python_tag|>, several separated by ';', text", () => {
    expect(parseToolCalls(plan("llama3_json"), LLAMA3)).toEqual({
      content: null,
      calls: [{ name: "get_weather", arguments: '{"city":"Oslo","unit":"celsius"}' }],
    });
    expect(parseToolCalls(plan("llama3_json"), LLAMA3_TAGGED)?.calls).toEqual([{ name: "find_verse", arguments: '{"book":"Genesis","chapter":1}' }]);
    expect(parseToolCalls(plan("llama3_json"), `${LLAMA3}; ${LLAMA3_TAGGED.slice(14)}`)?.calls.map((c) => c.name)).toEqual(["get_weather", "find_verse"]);
    expect(parseToolCalls(plan("llama3_json"), "The weather is fine.")).toBeNull();
  });
});

let C: EngineNode;
let L: EngineNode;
beforeAll(async () => {
  const model = await loadModel({ threads: 1, modelThread: "main" });
  // The embedded model's template shows Hermes <tool_call>s; L is told Llama 3's JSON form.
  [C, L] = await Promise.all([
    startEngineNode({ role: "both", model, blockTokens: 16, numBlocks: 64 }),
    startEngineNode({
      role: "both",
      model: await loadModel({ threads: 1, modelThread: "main" }),
      blockTokens: 16,
      numBlocks: 64,
      toolCallParser: "llama3_json",
    }),
  ]);
});
afterAll(async () => {
  await Promise.all([C?.shutdown(), L?.shutdown()]);
});

type Call = { id: string; type: string; function: { name: string; arguments: string } };
/** The response's message (tool_calls rebuilt from the deltas when streamed) and finish reason. */
async function chat(node: EngineNode, body: Record<string, unknown>, stream: boolean): Promise<{ content: string | null; calls: Call[]; finish: string }> {
  const res = await fetch(`http://${node.httpAddress}/v1/chat/completions`, {
    method: "POST",
    body: JSON.stringify({ messages: [{ role: "user", content: "What is the weather in Oslo?" }], tools: TOOLS, max_tokens: 120, stream, ...body }),
  });
  if (res.status !== 200) throw new Error(await res.text());
  if (!stream) {
    const c = ((await res.json()) as { choices: { message: { content: string | null; tool_calls?: Call[] }; finish_reason: string }[] }).choices[0]!;
    return { content: c.message.content, calls: c.message.tool_calls ?? [], finish: c.finish_reason };
  }
  const events = (await sseEvents(res)) as (
    | { choices: { delta: { content?: string | null; tool_calls?: (Call & { index: number })[] }; finish_reason: string | null }[] }
    | string
  )[];
  expect(events.at(-1)).toBe("[DONE]");
  let content = "";
  const calls: Call[] = [];
  let finish = "";
  for (const e of events) {
    if (typeof e === "string") continue;
    const c = e.choices[0]!;
    content += c.delta.content ?? "";
    // A call opens with its id and name; pieces of its arguments may follow under its index.
    for (const d of c.delta.tool_calls ?? []) {
      if (d.id !== undefined) {
        expect(d.index).toBe(calls.length);
        calls.push({ id: d.id, type: d.type, function: { ...d.function } });
      } else calls[d.index]!.function.arguments += d.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content: content === "" ? null : content, calls, finish };
}

function expectValidCalls(calls: Call[]): void {
  expect(calls.length).toBeGreaterThan(0);
  for (const c of calls) {
    expect(c.type).toBe("function");
    expect(c.id).toMatch(/^call_[0-9a-f]{24}$/);
    expect(schemaViolation(SCHEMAS[c.function.name], JSON.parse(c.function.arguments))).toBeNull();
  }
}

describe("tool_choice on the embedded model", () => {
  for (const stream of [false, true]) {
    test(`a named function: one valid call of it${stream ? ", streamed" : ""}`, async () => {
      for (const seed of [1, 2]) {
        const r = await chat(C, { tool_choice: { type: "function", function: { name: "get_weather" } }, temperature: 0.9, seed }, stream);
        expect(r.finish).toBe("tool_calls");
        expect(r.content).toBeNull();
        expect(r.calls.map((c) => c.function.name)).toEqual(["get_weather"]);
        expectValidCalls(r.calls);
      }
    });

    test(`required: valid calls of the offered tools; one with parallel_tool_calls false${stream ? ", streamed" : ""}`, async () => {
      for (const seed of [3, 4, 5]) {
        const r = await chat(C, { tool_choice: "required", parallel_tool_calls: false, temperature: 0.9, seed }, stream);
        expect(r.finish).toBe("tool_calls");
        expect(r.calls.length).toBe(1);
        expectValidCalls(r.calls);
      }
    });

    test(`auto, Hermes (from the template): text before streams as content, the calls as tool_calls${stream ? ", streamed" : ""}`, async () => {
      // The output is forced to a real model's text, so what is tested is the reading of it.
      const r = await chat(C, { tool_choice: "auto", structured_outputs: { choice: [HERMES_TWO] }, max_tokens: 200 }, stream);
      // Streamed, the content is what came before the call as it came (its newline too).
      expect({ ...r, content: r.content?.trim() }).toEqual({ content: "I will look both up.", calls: expect.any(Array), finish: "tool_calls" });
      expect(r.calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([
        ["get_weather", { city: "Oslo", unit: "celsius" }],
        ["find_verse", { book: "Exodus", chapter: 3 }],
      ]);
      const text = await chat(C, { tool_choice: "auto", structured_outputs: { choice: ["And it was so."] } }, stream);
      expect(text).toEqual({ content: "And it was so.", calls: [], finish: "stop" });
    });

    test(`auto, Llama 3 JSON (--tool-call-parser llama3_json)${stream ? ", streamed" : ""}`, async () => {
      const r = await chat(L, { structured_outputs: { choice: [LLAMA3] } }, stream);
      expect(r.finish).toBe("tool_calls");
      expect(r.content).toBeNull();
      expect(r.calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([["get_weather", { city: "Oslo", unit: "celsius" }]]);
    });
  }

  test("a named function's arguments stream as they come: the call opens once, its arguments follow in pieces", async () => {
    const res = await fetch(`http://${C.httpAddress}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({
        messages: [{ role: "user", content: "Weather?" }],
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_weather" } },
        max_tokens: 120,
        stream: true,
        seed: 9,
        temperature: 0.9,
      }),
    });
    type Delta = { index: number; id?: string; function: { name?: string; arguments: string } };
    const deltas = (await sseEvents(res)).flatMap((e) =>
      typeof e === "string" ? [] : ((e as { choices: { delta: { tool_calls?: Delta[] } }[] }).choices[0]?.delta.tool_calls ?? []),
    );
    expect(deltas.filter((d) => d.id !== undefined).length).toBe(1);
    expect(deltas[0]!.function.name).toBe("get_weather");
    expect(deltas.length).toBeGreaterThan(3);
    const args = deltas.map((d) => d.function.arguments).join("");
    expect(schemaViolation(WEATHER, JSON.parse(args))).toBeNull();
  });

  test("tool_choice none renders the tools and answers text; a named tool not offered is a 400", async () => {
    const r = await chat(C, { tool_choice: "none", structured_outputs: { choice: [HERMES_ONE] } }, false);
    expect(r).toEqual({ content: HERMES_ONE, calls: [], finish: "stop" });
    const res = await fetch(`http://${C.httpAddress}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ messages: [{ role: "user", content: "x" }], tools: TOOLS, tool_choice: { type: "function", function: { name: "launch" } } }),
    });
    expect(res.status).toBe(400);
  });

  test("the embedded template renders tools and assistant tool calls with content null", async () => {
    const history = [
      { role: "user", content: "Weather in Oslo?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo","unit":"celsius"}' } }],
      },
      { role: "tool", tool_call_id: "call_1", content: "3 C" },
    ];
    const res = await fetch(`http://${C.httpAddress}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ messages: history, tools: TOOLS, tool_choice: "none", max_tokens: 1, echo: undefined }),
    });
    expect(res.status).toBe(200);
    const without = await fetch(`http://${C.httpAddress}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ messages: history, max_tokens: 1 }) });
    const [a, b] = [(await res.json()) as { usage: { prompt_tokens: number } }, (await without.json()) as { usage: { prompt_tokens: number } }];
    expect(a.usage.prompt_tokens).toBeGreaterThan(b.usage.prompt_tokens + 20);
  });
});
