import type { SamplingParams } from "../engine/index.ts";
import { chatRenderer, ChatTemplateError, type ChatMessage, type ChatRenderer, type Tokenizer } from "../model/index.ts";
import { validateSampling } from "../rng/index.ts";
import { HttpError } from "./errors.ts";

export type CompletionKind = "completion" | "chat";

/** An OpenAI completions or chat request, checked and tokenized. */
export interface CompletionParams {
  kind: CompletionKind;
  model: string | undefined;
  promptTokens: number[];
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  seed: bigint;
  /** The request named no seed: `seed` was chosen here. */
  seedChosen: boolean;
  stop: string[];
  stopTokenIds: number[];
  stream: boolean;
  includeUsage: boolean;
  /** Extension (as in vLLM): each chunk carries the ids of its tokens; the gateway reads them. */
  returnTokenIds: boolean;
}

export interface ParseLimits {
  tokenizer: Tokenizer;
  maxModelLen: number;
  /** The model's chat template with its tokenizer; default: DEFAULT_CHAT_TEMPLATE on `tokenizer`. */
  chat?: ChatRenderer;
}

const U64_MAX = (1n << 64n) - 1n;

function bad(message: string, param: string | null = null): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

function optNumber(body: Record<string, unknown>, key: string, dflt: number): number {
  const v = body[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad(`${key} must be a number, got ${JSON.stringify(v)}`, key);
  return v;
}

function optInt(body: Record<string, unknown>, key: string, min: number): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min) throw bad(`${key} must be an integer ≥ ${min}, got ${JSON.stringify(v)}`, key);
  return v;
}

export function randomSeed(): bigint {
  const b = crypto.getRandomValues(new BigUint64Array(1));
  return b[0]!;
}

function parseSeed(v: unknown): bigint | undefined {
  if (v === undefined || v === null) return undefined;
  let s: bigint;
  if (typeof v === "number" && Number.isSafeInteger(v)) s = BigInt(v);
  else if (typeof v === "string" && /^\d{1,20}$/.test(v)) s = BigInt(v);
  else throw bad(`seed must be an integer in [0, 2^64), got ${JSON.stringify(v)}`, "seed");
  if (s < 0n || s > U64_MAX) throw bad(`seed ${s} outside [0, 2^64)`, "seed");
  return s;
}

function parseTokenIds(v: unknown[], vocab: number, param: string): number[] {
  return v.map((t) => {
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t >= vocab) {
      throw bad(`${param} token ${JSON.stringify(t)} outside the vocabulary 0..${vocab - 1}`, param);
    }
    return t;
  });
}

/** The messages as the template sees them: text parts joined; tool_calls, tool_call_id and name kept. */
function parseMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw bad("messages must be a non-empty array", "messages");
  return v.map((m, i) => {
    if (typeof m !== "object" || m === null) throw bad(`messages[${i}] must be an object`, "messages");
    const { role, content, ...rest } = m as Record<string, unknown>;
    if (typeof role !== "string" || !["system", "user", "assistant", "developer", "tool"].includes(role)) {
      throw bad(`messages[${i}].role ${JSON.stringify(role)} is not one of system, user, assistant, developer, tool`, "messages");
    }
    if (rest.tool_calls !== undefined && rest.tool_calls !== null && (role !== "assistant" || !Array.isArray(rest.tool_calls))) {
      throw bad(`messages[${i}].tool_calls must be an array on an assistant message`, "messages");
    }
    if (typeof content === "string") return { ...rest, role, content };
    if ((content === null || content === undefined) && Array.isArray(rest.tool_calls)) return { ...rest, role, content: null };
    if (Array.isArray(content)) {
      const parts = content.map((p) => {
        const part = p as Record<string, unknown>;
        if (part?.type !== "text" || typeof part.text !== "string") throw bad(`messages[${i}].content: only text parts are supported`, "messages");
        return part.text;
      });
      return { ...rest, role, content: parts.join("") };
    }
    throw bad(`messages[${i}].content must be a string or text parts`, "messages");
  });
}

function parseTools(v: unknown): unknown[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((t) => typeof t !== "object" || t === null)) throw bad("tools must be an array of objects", "tools");
  return v;
}

function chatPromptTokens(body: Record<string, unknown>, lim: ParseLimits): number[] {
  const messages = parseMessages(body.messages);
  const tools = parseTools(body.tools);
  try {
    return (lim.chat ?? chatRenderer(lim.tokenizer, null)).promptTokens(messages, tools);
  } catch (e) {
    if (e instanceof ChatTemplateError) throw bad(e.message, "messages");
    throw e;
  }
}

/** Checks an OpenAI request body the way the OpenAI API does, and tokenizes its prompt. */
export function parseCompletion(kind: CompletionKind, raw: unknown, lim: ParseLimits): CompletionParams {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw bad("request body must be a JSON object");
  const body = raw as Record<string, unknown>;
  const vocab = lim.tokenizer.vocabSize;
  let promptTokens: number[];
  if (kind === "chat") {
    promptTokens = chatPromptTokens(body, lim);
  } else {
    const p = body.prompt;
    if (p === "" || (Array.isArray(p) && p.length === 1 && p[0] === "")) throw bad("prompt is empty", "prompt");
    if (typeof p === "string") promptTokens = lim.tokenizer.encode(p);
    else if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") promptTokens = lim.tokenizer.encode(p[0]);
    else if (Array.isArray(p) && p.length > 0 && p.every((t) => typeof t === "number")) promptTokens = parseTokenIds(p, vocab, "prompt");
    else if (Array.isArray(p) && p.length === 1 && Array.isArray(p[0])) promptTokens = parseTokenIds(p[0], vocab, "prompt");
    else throw bad("prompt must be a non-empty string, one string in an array, or an array of token ids", "prompt");
  }
  if (promptTokens.length === 0) throw bad("prompt is empty", "prompt");
  const n = optInt(body, "n", 1);
  if (n !== undefined && n !== 1) throw bad(`n = ${n}: only n = 1 is supported`, "n");

  const room = lim.maxModelLen - promptTokens.length;
  const maxTokens = optInt(body, kind === "chat" ? "max_completion_tokens" : "max_tokens", 1) ?? optInt(body, "max_tokens", 1) ?? (kind === "chat" ? room : 16);
  if (promptTokens.length + maxTokens > lim.maxModelLen) {
    throw bad(
      `prompt (${promptTokens.length} tokens) + max_tokens (${maxTokens}) = ${promptTokens.length + maxTokens} exceeds the model's context of ${lim.maxModelLen}`,
      "max_tokens",
    );
  }
  const temperature = optNumber(body, "temperature", 1);
  const topP = optNumber(body, "top_p", 1);
  const topK = optInt(body, "top_k", -1) ?? 0;
  const problem = validateSampling({ temperature, topP, topK: topK < 0 ? 0 : topK });
  if (problem) throw bad(problem);

  const stopRaw = body.stop;
  let stop: string[] = [];
  if (typeof stopRaw === "string") stop = [stopRaw];
  else if (Array.isArray(stopRaw) && stopRaw.every((s) => typeof s === "string")) stop = stopRaw as string[];
  else if (stopRaw !== undefined && stopRaw !== null) throw bad("stop must be a string or an array of strings", "stop");
  if (stop.length > 4) throw bad(`stop has ${stop.length} sequences; at most 4`, "stop");
  stop = stop.filter((s) => s.length > 0);
  const stopTokenIds = Array.isArray(body.stop_token_ids) ? parseTokenIds(body.stop_token_ids, vocab, "stop_token_ids") : [];

  const seedGiven = parseSeed(body.seed);
  const streamOpts = body.stream_options as Record<string, unknown> | undefined;
  return {
    kind,
    model: typeof body.model === "string" ? body.model : undefined,
    promptTokens,
    maxTokens,
    temperature,
    topP: topP === 0 ? 1 : topP,
    topK: topK < 0 ? 0 : topK,
    seed: seedGiven ?? randomSeed(),
    seedChosen: seedGiven === undefined,
    stop,
    stopTokenIds,
    stream: body.stream === true,
    includeUsage: streamOpts?.include_usage === true,
    returnTokenIds: body.return_token_ids === true,
  };
}

/** The request's sampling fields, as the engine (and EngineControl's SamplingParams) name them. */
export function samplingOf(p: CompletionParams): SamplingParams {
  return { temperature: p.temperature, topP: p.topP, topK: p.topK, seed: p.seed, maxTokens: p.maxTokens, stopTokenIds: p.stopTokenIds };
}
