import { checkSchema, ConstraintError, type ConstraintSpec } from "../grammar/index.ts";
import { quote } from "../codec/index.ts";
import { HttpError } from "./errors.ts";

/** One function the client offers (OpenAI's `tools[i].function`). */
export interface ToolSpec {
  name: string;
  description?: string;
  /** Its arguments' JSON schema (an empty object schema when the tool takes none). */
  parameters: Record<string, unknown>;
}

/** The model's tool-call syntax `auto` parses: vLLM's parser names. */
export type ToolParserName = "hermes" | "llama3_json";

/**
 * What a request's `tools` and `tool_choice` ask for:
 * - `none`: the tools are rendered into the prompt, the output is text;
 * - `auto`: the output is parsed with the model's tool-call syntax (`parser`) into tool_calls
 *   when it holds any, else it is text;
 * - `required`: the output is constrained to a JSON array of {"name", "parameters"} calls of
 *   the offered tools (one call unless parallel_tool_calls), each valid for its schema;
 * - `named`: the output is constrained to the named tool's arguments.
 */
export interface ToolPlan {
  mode: "none" | "auto" | "required" | "named";
  tools: ToolSpec[];
  /** named: the tool. */
  name?: string;
  parallel: boolean;
  /** auto: how calls are read from the text. */
  parser: ToolParserName | null;
  /** What the template renders: the request's tools as given. */
  rendered: unknown[];
}

const MAX_TOOLS = 128;

function bad(message: string, param: string): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

/** The tool-call syntax a chat template shows (its tool-call markers), or null when it shows none. */
export function parserOfTemplate(template: string | undefined): ToolParserName | null {
  if (!template) return null;
  if (template.includes("<tool_call>")) return "hermes";
  if (template.includes("<|python_tag|>") || template.includes("ipython")) return "llama3_json";
  return null;
}

/**
 * Parses `tools`, `tool_choice` and `parallel_tool_calls` (chat only), or null when the
 * request offers no tools. `parser` is the engine's --tool-call-parser, else the template's.
 */
export function parseTools(body: Record<string, unknown>, parser: ToolParserName | null): ToolPlan | null {
  const raw = body.tools;
  const choice = body.tool_choice ?? undefined;
  const parallelRaw = body.parallel_tool_calls;
  if (parallelRaw !== undefined && parallelRaw !== null && typeof parallelRaw !== "boolean")
    throw bad("parallel_tool_calls must be a boolean", "parallel_tool_calls");
  if (raw === undefined || raw === null || (Array.isArray(raw) && raw.length === 0)) {
    if (choice !== undefined && choice !== "none") throw bad("tool_choice needs tools", "tool_choice");
    return null;
  }
  if (!Array.isArray(raw) || raw.some((t) => typeof t !== "object" || t === null)) throw bad("tools must be an array of objects", "tools");
  if (raw.length > MAX_TOOLS) throw bad(`tools has ${raw.length} entries; at most ${MAX_TOOLS}`, "tools");
  const tools = raw.map((t, i): ToolSpec => {
    const at = `tools[${i}]`;
    const tool = t as Record<string, unknown>;
    if (typeof t !== "object" || t === null || tool.type !== "function") throw bad(`${at} must be {"type": "function", "function": {...}}`, "tools");
    const fn = tool.function as Record<string, unknown>;
    if (typeof fn !== "object" || fn === null || typeof fn.name !== "string" || !/^[A-Za-z0-9_.-]{1,64}$/.test(fn.name))
      throw bad(`${at}.function.name must be 1-64 letters, digits, _, . or -`, "tools");
    if (fn.description !== undefined && typeof fn.description !== "string") throw bad(`${at}.function.description must be a string`, "tools");
    const params = fn.parameters ?? { type: "object", properties: {} };
    if (typeof params !== "object" || params === null || Array.isArray(params)) throw bad(`${at}.function.parameters must be a JSON schema object`, "tools");
    try {
      checkSchema(params, `${at}.function.parameters`);
    } catch (e) {
      if (e instanceof ConstraintError) throw bad(e.message, "tools");
      throw e;
    }
    return { name: fn.name, ...(typeof fn.description === "string" ? { description: fn.description } : {}), parameters: params as Record<string, unknown> };
  });
  const names = new Set(tools.map((t) => t.name));
  if (names.size !== tools.length) throw bad("tools must have distinct function names", "tools");
  const parallel = parallelRaw !== false;
  const plan: ToolPlan = { mode: "auto", tools, parallel, parser, rendered: raw };
  if (choice === undefined || choice === "auto") {
    if (parser === null)
      throw bad(
        'tool_choice "auto" needs the model\'s tool-call syntax, which its chat template does not show: start the engine with --tool-call-parser (hermes, llama3_json), or send tool_choice "required" or a named function',
        "tool_choice",
      );
    return plan;
  }
  if (choice === "none" || choice === "required") return { ...plan, mode: choice };
  const named = choice as { type?: unknown; function?: { name?: unknown } };
  if (typeof choice === "object" && named?.type === "function" && typeof named.function?.name === "string") {
    if (!names.has(named.function.name)) throw bad(`tool_choice names ${quote(named.function.name)}, which is not among the tools`, "tool_choice");
    return { ...plan, mode: "named", name: named.function.name };
  }
  throw bad('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice");
}

/** The constraint that makes the output a valid call: required and named only. */
export function toolConstraint(plan: ToolPlan): ConstraintSpec | null {
  if (plan.mode === "named") return { kind: "json_schema", source: JSON.stringify(plan.tools.find((t) => t.name === plan.name)!.parameters) };
  if (plan.mode !== "required") return null;
  const call = (t: ToolSpec) => ({
    type: "object",
    properties: { name: { const: t.name }, parameters: t.parameters },
    required: ["name", "parameters"],
    additionalProperties: false,
  });
  const items = plan.tools.length === 1 ? call(plan.tools[0]!) : { anyOf: plan.tools.map(call) };
  return { kind: "json_schema", source: JSON.stringify({ type: "array", items, minItems: 1, ...(plan.parallel ? {} : { maxItems: 1 }) }) };
}

/** One parsed call, before it gets its id. */
export interface ParsedCall {
  name: string;
  arguments: string;
}

/** The calls in a finished output, and the text beside them; null when it holds no valid call (it is all text). */
export function parseToolCalls(plan: ToolPlan, text: string): { content: string | null; calls: ParsedCall[] } | null {
  const known = (name: unknown): name is string => typeof name === "string" && plan.tools.some((t) => t.name === name);
  const callOf = (v: unknown): ParsedCall | null => {
    const o = v as { name?: unknown; arguments?: unknown; parameters?: unknown };
    if (typeof v !== "object" || v === null || !known(o.name)) return null;
    const args = o.arguments ?? o.parameters ?? {};
    if (typeof args !== "object" || args === null || Array.isArray(args)) return null;
    return { name: o.name, arguments: JSON.stringify(args) };
  };
  const json = (s: string): unknown => {
    try {
      return JSON.parse(s);
    } catch {
      return undefined;
    }
  };
  switch (plan.mode) {
    case "none":
      return null;
    case "named": {
      // The arguments as generated (what a stream sends piece by piece), once they parse.
      const args = json(text);
      if (typeof args !== "object" || args === null || Array.isArray(args)) return null;
      return { content: null, calls: [{ name: plan.name!, arguments: text.trim() }] };
    }
    case "required": {
      const arr = json(text);
      if (!Array.isArray(arr) || arr.length === 0) return null;
      const calls = arr.map(callOf);
      return calls.every((c) => c !== null) ? { content: null, calls: calls as ParsedCall[] } : null;
    }
    case "auto":
      return plan.parser === "llama3_json" ? parseLlama3(text, callOf, json) : parseHermes(text, callOf, json);
  }
}

const HERMES_OPEN = "<tool_call>";
const HERMES_CLOSE = "</tool_call>";

/** Hermes / Qwen2.5: text, then one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. */
function parseHermes(text: string, callOf: (v: unknown) => ParsedCall | null, json: (s: string) => unknown) {
  const start = text.indexOf(HERMES_OPEN);
  if (start < 0) return null;
  const calls: ParsedCall[] = [];
  let at = start;
  while (at >= 0) {
    const end = text.indexOf(HERMES_CLOSE, at);
    // A call cut short (max_tokens) may lack its close: what parses still counts.
    const body = text.slice(at + HERMES_OPEN.length, end < 0 ? undefined : end).trim();
    const call = callOf(json(body));
    if (call === null) return null;
    calls.push(call);
    if (end < 0) break;
    at = text.indexOf(HERMES_OPEN, end);
  }
  const content = text.slice(0, start).trim();
  return { content: content === "" ? null : content, calls };
}

/** Llama 3.x JSON tool calling: the output is `{"name": ..., "parameters": {...}}` (several separated by ";"), optionally after <|python_tag|>. */
function parseLlama3(text: string, callOf: (v: unknown) => ParsedCall | null, json: (s: string) => unknown) {
  const body = text.replace(/^\s*(<\|python_tag\|>)?\s*/, "").trim();
  if (!body.startsWith("{")) return null;
  const whole = callOf(json(body));
  if (whole) return { content: null, calls: [whole] };
  const calls = body.split(/\}\s*;\s*\{/).map((p, i, all) => callOf(json((i > 0 ? "{" : "") + p + (i < all.length - 1 ? "}" : ""))));
  return calls.every((c) => c !== null) ? { content: null, calls: calls as ParsedCall[] } : null;
}

/**
 * Streamed: how much of the text so far may go out as content now. Text that is, or may
 * become, a tool call is held to the end (then parsed): all of it for required and a named
 * function; for auto from a Hermes `<tool_call>` (or a piece of text that could be its start),
 * or, for Llama 3 JSON, an output that starts with "{".
 */
export function safeContentLength(plan: ToolPlan, text: string): number {
  if (plan.mode === "none") return text.length;
  if (plan.mode !== "auto") return 0;
  if (plan.parser === "llama3_json") {
    const t = text.replace(/^\s*(<\|python_tag\|>)?/, "");
    return t === "" || t.startsWith("{") ? 0 : text.length;
  }
  const open = text.indexOf(HERMES_OPEN);
  if (open >= 0) return open;
  for (let k = Math.min(HERMES_OPEN.length - 1, text.length); k > 0; k--) if (HERMES_OPEN.startsWith(text.slice(text.length - k))) return text.length - k;
  return text.length;
}
