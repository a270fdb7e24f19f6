import type { SamplingParams } from "../engine/index.ts";
import { chatRenderer, ChatTemplateError, type ChatMessage, type ChatRenderer, type Tokenizer } from "../tokenizer/index.ts";
import { choiceSeed, MAX_TOP_LOGPROBS, randomSeed, validateLogits, validateSampling } from "../rng/index.ts";
import { parseMessages } from "./chat-messages.ts";
import { HttpError } from "./errors.ts";
import type { ConstraintSpec } from "../grammar/index.ts";
import { auditFields, type CompletionKind } from "./openai-params.ts";
import { parseStructuredOutput } from "./structured-output.ts";
import { parserOfTemplate, parseTools, toolConstraint, type ToolParserName, type ToolPlan } from "./tool-calls.ts";
import { checkInputBounds } from "./input-bounds.ts";
import { quote } from "../codec/index.ts";

/** An OpenAI completions or chat request, checked and tokenized. */
export interface CompletionParams {
  kind: CompletionKind;
  model: string | undefined;
  /** Chat: the checked messages the prompt was rendered from. */
  messages: ChatMessage[] | null;
  /** The first (for chat: the only) prompt; `prompts[0]`. */
  promptTokens: number[];
  /** Completions: every prompt of a list; choice i*n + j is prompt i's j-th sample. */
  prompts: number[][];
  /** Choices generated per prompt: best_of when it is larger than n. */
  n: number;
  /** Choices returned per prompt (the request's n): with best_of > n, the best by cumulative logprob. */
  returned: number;
  /** Completions: the prompt's text starts each choice's text. */
  echo: boolean;
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  seed: bigint;
  /** The request named no seed: `seed` was chosen here. */
  seedChosen: boolean;
  stop: string[];
  stopTokenIds: number[];
  /** vLLM: the stop string that ended the text is kept in it. */
  includeStopStr: boolean;
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
  logitBias: Map<number, number>;
  minTokens: number;
  ignoreEos: boolean;
  /** Alternatives per token when logprobs are computed (asked for, or needed by best_of); null = none. */
  topLogprobs: number | null;
  /** The request asked for logprobs: they are in the response. */
  showLogprobs: boolean;
  stream: boolean;
  includeUsage: boolean;
  /** Extension (as in vLLM): each chunk carries the ids of its tokens; the gateway reads them. */
  returnTokenIds: boolean;
  /** Fields unknown to this engine, served without effect (openai-params.ts). */
  ignoredFields: string[];
  /** The structured output every choice is constrained to (structured-output.ts, or a forced tool call); null = free text. */
  constraint: ConstraintSpec | null;
  /** Chat: the tools offered and what tool_choice asks (tool-calls.ts); null = none. */
  tools: ToolPlan | null;
}

export interface ParseLimits {
  tokenizer: Tokenizer;
  maxModelLen: number;
  /** The model's chat template with its tokenizer; default: DEFAULT_CHAT_TEMPLATE on `tokenizer`. */
  chat?: ChatRenderer;
  /** --tool-call-parser: how tool_choice "auto" reads calls; default: what the chat template shows. */
  toolParser?: ToolParserName | null;
}

/** Bounds on what one request may ask for, checked before any work. */
export const LIMITS = { n: 16, prompts: 64, choices: 64, stop: 4, stopChars: 1024, stopTokenIds: 1024, logitBias: 1024 } as const;

const U64_MAX = (1n << 64n) - 1n;

function bad(message: string, param: string | null = null): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

function optNumber(body: Record<string, unknown>, key: string, dflt: number): number {
  const v = body[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad(`${key} must be a number, got ${quote(v)}`, key);
  return v;
}

function optInt(body: Record<string, unknown>, key: string, min: number, max = Number.MAX_SAFE_INTEGER): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw bad(`${key} must be an integer in [${min}, ${max}], got ${quote(v)}`, key);
  }
  return v;
}

function optBool(body: Record<string, unknown>, key: string): boolean {
  const v = body[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw bad(`${key} must be a boolean, got ${quote(v)}`, key);
  return v;
}

function parseSeed(v: unknown): bigint | undefined {
  if (v === undefined || v === null) return undefined;
  let s: bigint;
  if (typeof v === "number" && Number.isSafeInteger(v)) s = BigInt(v);
  else if (typeof v === "string" && /^\d{1,20}$/.test(v)) s = BigInt(v);
  else throw bad(`seed must be an integer in [0, 2^64) (as a string above 2^53), got ${quote(v)}`, "seed");
  if (s < 0n || s > U64_MAX) throw bad(`seed ${s} outside [0, 2^64)`, "seed");
  return s;
}

function parseTokenIds(v: unknown[], vocab: number, param: string): number[] {
  return v.map((t) => {
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t >= vocab) {
      throw bad(`${param} token ${quote(t)} outside the vocabulary 0..${vocab - 1}`, param);
    }
    return t;
  });
}

/** Completions' `prompt`: a string, a list of strings, a list of token ids, or a list of those. */
function parsePrompts(p: unknown, tokenizer: Tokenizer): number[][] {
  const vocab = tokenizer.vocabSize;
  const one = (x: unknown): number[] | null => {
    if (typeof x === "string") return x === "" ? [] : tokenizer.encode(x);
    if (Array.isArray(x) && x.length > 0 && x.every((t) => typeof t === "number")) return parseTokenIds(x, vocab, "prompt");
    return null;
  };
  const single = one(p);
  let prompts: (number[] | null)[];
  if (single !== null) prompts = [single];
  else if (Array.isArray(p) && p.length > 0) {
    if (p.length > LIMITS.prompts) throw bad(`prompt has ${p.length} prompts; at most ${LIMITS.prompts}`, "prompt");
    prompts = p.map(one);
  } else prompts = [null];
  if (prompts.some((x) => x === null))
    throw bad("prompt must be a string, an array of strings, an array of token ids, or an array of token-id arrays", "prompt");
  if (prompts.some((x) => x!.length === 0)) throw bad("prompt is empty", "prompt");
  return prompts as number[][];
}

function parseStop(v: unknown): string[] {
  let stop: string[];
  if (v === undefined || v === null) stop = [];
  else if (typeof v === "string") stop = [v];
  else if (Array.isArray(v) && v.every((s) => typeof s === "string")) stop = v as string[];
  else throw bad("stop must be a string or an array of strings", "stop");
  if (stop.length > LIMITS.stop) throw bad(`stop has ${stop.length} sequences; at most ${LIMITS.stop}`, "stop");
  const long = stop.find((s) => s.length > LIMITS.stopChars);
  if (long !== undefined) throw bad(`a stop sequence has ${long.length} characters; at most ${LIMITS.stopChars}`, "stop");
  return stop.filter((s) => s.length > 0);
}

function parseLogitBias(v: unknown, vocab: number): Map<number, number> {
  const out = new Map<number, number>();
  if (v === undefined || v === null) return out;
  if (typeof v !== "object" || Array.isArray(v)) throw bad("logit_bias must be an object of token id → bias", "logit_bias");
  const entries = Object.entries(v);
  if (entries.length > LIMITS.logitBias) throw bad(`logit_bias has ${entries.length} entries; at most ${LIMITS.logitBias}`, "logit_bias");
  for (const [k, b] of entries) {
    if (!/^\d{1,9}$/.test(k) || Number(k) >= vocab) throw bad(`logit_bias key ${quote(k)} is not a token id in 0..${vocab - 1}`, "logit_bias");
    if (typeof b !== "number") throw bad(`logit_bias[${k}] must be a number, got ${quote(b)}`, "logit_bias");
    out.set(Number(k), b);
  }
  return out;
}

/** logprobs: chat's boolean with top_logprobs, or completions' count. Null when not asked for. */
function parseLogprobs(kind: CompletionKind, body: Record<string, unknown>): number | null {
  if (kind === "completion") return optInt(body, "logprobs", 0, MAX_TOP_LOGPROBS) ?? null;
  const want = optBool(body, "logprobs");
  const top = optInt(body, "top_logprobs", 0, MAX_TOP_LOGPROBS);
  if (top !== undefined && !want) throw bad("top_logprobs needs logprobs: true", "top_logprobs");
  return want ? (top ?? 0) : null;
}

function parseStreamOptions(body: Record<string, unknown>, stream: boolean): boolean {
  const o = body.stream_options;
  if (o === undefined || o === null) return false;
  if (!stream) throw bad("stream_options is only allowed when stream is true", "stream_options");
  if (typeof o !== "object" || Array.isArray(o)) throw bad("stream_options must be an object", "stream_options");
  for (const k of Object.keys(o)) {
    if (k !== "include_usage") throw bad(`stream_options.${quote(k)} is not supported; only include_usage`, "stream_options");
  }
  const u = (o as Record<string, unknown>).include_usage;
  if (u !== undefined && typeof u !== "boolean") throw bad("stream_options.include_usage must be a boolean", "stream_options");
  return u === true;
}

/** max_tokens, bounded by what the context leaves after the longest prompt. */
function parseMaxTokens(kind: CompletionKind, body: Record<string, unknown>, promptLen: number, maxModelLen: number): number {
  const room = maxModelLen - promptLen;
  const given = (kind === "chat" ? optInt(body, "max_completion_tokens", 1) : undefined) ?? optInt(body, "max_tokens", 1);
  if (given === undefined && room < 1) {
    throw bad(`the prompt (${promptLen} tokens) fills the model's context of ${maxModelLen} tokens: no room for any output`, "messages");
  }
  const maxTokens = given ?? (kind === "chat" ? room : Math.min(16, room));
  if (promptLen + maxTokens > maxModelLen) {
    throw bad(
      `prompt (${promptLen} tokens) + max_tokens (${maxTokens}) = ${promptLen + maxTokens} exceeds the model's context of ${maxModelLen}`,
      "max_tokens",
    );
  }
  return maxTokens;
}

/**
 * n, and best_of as vLLM (V0) did: best_of ≥ n candidates are generated per prompt and
 * the n with the highest cumulative logprob returned; not with stream (as OpenAI).
 */
function parseN(kind: CompletionKind, body: Record<string, unknown>, prompts: number, stream: boolean): { n: number; returned: number } {
  const returned = optInt(body, "n", 1, LIMITS.n) ?? 1;
  const bestOf = (kind === "completion" ? optInt(body, "best_of", 1, LIMITS.n) : undefined) ?? returned;
  if (bestOf < returned) throw bad(`best_of (${bestOf}) must be ≥ n (${returned})`, "best_of");
  if (bestOf > returned && stream) throw bad(`best_of (${bestOf}) > n (${returned}) cannot be streamed`, "best_of");
  if (bestOf * prompts > LIMITS.choices)
    throw bad(
      `${prompts} prompts × ${bestOf === returned ? "n" : "best_of"} = ${bestOf} is ${bestOf * prompts} choices; at most ${LIMITS.choices}`,
      bestOf === returned ? "n" : "best_of",
    );
  return { n: bestOf, returned };
}

/** The chat prompt as the model's template renders it, with the request's tools. */
function chatPromptTokens(messages: ChatMessage[], lim: ParseLimits, tools: ToolPlan | null): number[] {
  try {
    return (lim.chat ?? chatRenderer(lim.tokenizer, null)).promptTokens(messages, tools?.rendered);
  } catch (e) {
    if (e instanceof ChatTemplateError) throw bad(e.message, "messages");
    throw e;
  }
}

/** The fields that shape sampling: temperature, top_p/top_k, the logits processors, min_tokens, stop_token_ids. */
function parseSamplingFields(body: Record<string, unknown>, vocab: number, maxTokens: number) {
  const temperature = optNumber(body, "temperature", 1);
  const topP = optNumber(body, "top_p", 1);
  if (!(topP > 0 && topP <= 1)) throw bad(`top_p must be in (0, 1], got ${topP}`, "top_p");
  const topK = optInt(body, "top_k", -1) ?? 0;
  const problem = validateSampling({ temperature, topP, topK: topK < 0 ? 0 : topK });
  if (problem) throw bad(problem, problem.split(" ")[0]!);

  const ids = body.stop_token_ids === undefined || body.stop_token_ids === null ? [] : Array.isArray(body.stop_token_ids) ? body.stop_token_ids : null;
  if (ids === null) throw bad("stop_token_ids must be an array of token ids", "stop_token_ids");
  if (ids.length > LIMITS.stopTokenIds) throw bad(`stop_token_ids has ${ids.length} entries; at most ${LIMITS.stopTokenIds}`, "stop_token_ids");
  const processing = {
    presencePenalty: optNumber(body, "presence_penalty", 0),
    frequencyPenalty: optNumber(body, "frequency_penalty", 0),
    repetitionPenalty: optNumber(body, "repetition_penalty", 1),
    logitBias: parseLogitBias(body.logit_bias, vocab),
  };
  const invalid = validateLogits(processing, vocab);
  if (invalid) throw bad(invalid, invalid.split(/[ []/)[0]!);
  const minTokens = optInt(body, "min_tokens", 0) ?? 0;
  if (minTokens > maxTokens) throw bad(`min_tokens (${minTokens}) must be ≤ max_tokens (${maxTokens})`, "min_tokens");
  return {
    temperature,
    topP,
    topK: topK < 0 ? 0 : topK,
    stopTokenIds: parseTokenIds(ids, vocab, "stop_token_ids"),
    ...processing,
    minTokens,
    ignoreEos: optBool(body, "ignore_eos"),
  };
}

/** Checks an OpenAI request body as vLLM does (every field: openai-params.ts), and tokenizes its prompts. */
export function parseCompletion(kind: CompletionKind, raw: unknown, lim: ParseLimits): CompletionParams {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw bad("request body must be a JSON object");
  const body = raw as Record<string, unknown>;
  checkInputBounds(kind, body, lim.maxModelLen);
  const ignoredFields = auditFields(kind, body);
  const vocab = lim.tokenizer.vocabSize;
  let messages: ChatMessage[] | null = null;
  let prompts: number[][];
  const structured = parseStructuredOutput(body);
  const tools = kind === "chat" ? parseTools(body, lim.toolParser ?? parserOfTemplate((lim.chat ?? chatRenderer(lim.tokenizer, null)).templateSource)) : null;
  const forced = tools ? toolConstraint(tools) : null;
  if (forced && structured)
    throw bad(`tool_choice ${JSON.stringify(tools!.mode)} already constrains the output: it cannot be combined with a structured output`, "tool_choice");
  const constraint = structured ?? forced;
  if (constraint && optBool(body, "ignore_eos"))
    throw bad("ignore_eos cannot be combined with a structured output: the output ends where its grammar does", "ignore_eos");
  if (kind === "chat") {
    messages = parseMessages(body.messages);
    prompts = [chatPromptTokens(messages, lim, tools)];
  } else prompts = parsePrompts(body.prompt, lim.tokenizer);
  const promptTokens = prompts[0]!;
  if (promptTokens.length === 0) throw bad("prompt is empty", "prompt");
  const stream = optBool(body, "stream");
  const { n, returned } = parseN(kind, body, prompts.length, stream);
  const maxTokens = parseMaxTokens(kind, body, Math.max(...prompts.map((p) => p.length)), lim.maxModelLen);

  const sampling = parseSamplingFields(body, vocab, maxTokens);
  const topLogprobs = parseLogprobs(kind, body);
  const echo = kind === "completion" && optBool(body, "echo");
  if (echo && topLogprobs !== null) throw bad("echo with logprobs (prompt logprobs) is not supported", "echo");

  const seedGiven = parseSeed(body.seed);
  return {
    kind,
    model: typeof body.model === "string" ? body.model : undefined,
    messages,
    promptTokens,
    prompts,
    n,
    returned,
    echo,
    maxTokens,
    ...sampling,
    seed: seedGiven ?? randomSeed(),
    seedChosen: seedGiven === undefined,
    stop: parseStop(body.stop),
    includeStopStr: optBool(body, "include_stop_str_in_output"),
    // best_of ranks candidates by cumulative logprob: computed even when not shown.
    topLogprobs: topLogprobs ?? (n > returned ? 0 : null),
    showLogprobs: topLogprobs !== null,
    stream,
    includeUsage: parseStreamOptions(body, stream),
    returnTokenIds: optBool(body, "return_token_ids"),
    ignoredFields,
    constraint,
    tools,
  };
}

/** The request's sampling fields, as the engine (and EngineControl's SamplingParams) name them. */
export function samplingOf(p: CompletionParams, choice = 0): SamplingParams {
  return {
    temperature: p.temperature,
    topP: p.topP,
    topK: p.topK,
    seed: choiceSeed(p.seed, choice),
    maxTokens: p.maxTokens,
    stopTokenIds: p.stopTokenIds,
    presencePenalty: p.presencePenalty,
    frequencyPenalty: p.frequencyPenalty,
    repetitionPenalty: p.repetitionPenalty,
    logitBias: p.logitBias,
    minTokens: p.minTokens,
    ignoreEos: p.ignoreEos,
    topLogprobs: p.topLogprobs ?? undefined,
  };
}

export { choiceSeed, randomSeed };
