import { log } from "../obs/index.ts";
import { HttpError } from "./errors.ts";
import { STRUCTURED_FIELDS } from "./structured-output.ts";
import { quote } from "../codec/index.ts";

/** Which of OpenAI's two text endpoints a request came in by: its fields are tabled per endpoint. */
export type CompletionKind = "completion" | "chat";

/**
 * Every request field of OpenAI's chat and completions APIs and of vLLM's extras, and
 * what this engine does with it: parsed in completion-request.ts ("implemented"),
 * accepted without effect on the tokens because it only identifies or tags a request
 * ("identity"), or refused with a 400 naming it (a function that says which values are
 * refused and why). A field in none of these lists is unknown: as vLLM does, the
 * request is served and the field named in a warning log line (a client library's
 * newer field must not break serving); the response's `x-tl-ignored-fields` header
 * names them too, so nothing is ignored silently.
 */
type Refusal = (v: unknown) => string | null;

const never =
  (why: string): Refusal =>
  () =>
    why;
const unless =
  (ok: (v: unknown) => boolean, why: string): Refusal =>
  (v) =>
    ok(v) ? null : why;
const LEGACY_TOOLS = "the legacy functions / function_call fields are not supported; send tools and tool_choice";
const SAMPLER = "is not supported by this engine's sampler";

const IMPLEMENTED_COMMON = [
  "model",
  "frequency_penalty",
  "presence_penalty",
  "logit_bias",
  "logprobs",
  "max_tokens",
  "n",
  "seed",
  "stop",
  "stream",
  "stream_options",
  "temperature",
  "top_p",
  "top_k",
  "repetition_penalty",
  "min_tokens",
  "ignore_eos",
  "stop_token_ids",
  "include_stop_str_in_output",
  "return_token_ids",
  // Structured outputs: each spelling parsed, or refused there by name.
  ...STRUCTURED_FIELDS,
];
const IMPLEMENTED: Record<CompletionKind, ReadonlySet<string>> = {
  chat: new Set([...IMPLEMENTED_COMMON, "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"]),
  completion: new Set([...IMPLEMENTED_COMMON, "prompt", "echo", "best_of"]),
};

const IDENTITY = new Set(["user", "safety_identifier", "prompt_cache_key", "metadata", "service_tier", "store"]);

// Client-named keys are looked up in Maps (and Sets) only: in a plain object `__proto__`,
// `constructor` or `hasOwnProperty` would find Object.prototype's members.
const REFUSED_COMMON: [string, Refusal][] = Object.entries({
  suffix: never("suffix (insertion) is not supported"),
  min_p: never(`min_p ${SAMPLER}`),
  typical_p: never(`typical_p ${SAMPLER}`),
  use_beam_search: unless((v) => v === false, "beam search is not supported"),
  length_penalty: never("length_penalty applies to beam search, which is not supported"),
  prompt_logprobs: never("prompt_logprobs is not supported"),
  allowed_token_ids: never("allowed_token_ids is not supported; use logit_bias"),
  bad_words: never("bad_words is not supported; use logit_bias"),
  logits_processors: never("custom logits processors are not supported"),
  truncate_prompt_tokens: never("prompt truncation is not supported: send a prompt that fits"),
  add_special_tokens: never("add_special_tokens is not supported"),
  skip_special_tokens: unless((v) => v === true, "skip_special_tokens: false is not supported (special tokens are always skipped)"),
  spaces_between_special_tokens: unless((v) => v === true, "spaces_between_special_tokens: false is not supported"),
  return_tokens_as_token_ids: never("return_tokens_as_token_ids is not supported"),
  priority: never("request priority is not supported"),
  request_id: never("request_id in the body is not supported; send the x-request-id header"),
  cache_salt: never("cache_salt is not supported"),
  kv_transfer_params: never("kv_transfer_params is not supported (this engine runs its own hand-off)"),
  vllm_xargs: never("vllm_xargs is not supported"),
  mm_processor_kwargs: never("multimodal input is not supported"),
  logits_processor_pattern: never("custom logits processors are not supported"),
});

const REFUSED: Record<CompletionKind, ReadonlyMap<string, Refusal>> = {
  chat: new Map([
    ...REFUSED_COMMON,
    ...Object.entries<Refusal>({
      functions: never(LEGACY_TOOLS),
      function_call: unless((v) => v === "none", LEGACY_TOOLS),
      audio: never("audio output is not supported"),
      modalities: unless((v) => Array.isArray(v) && v.every((m) => m === "text"), "only the text modality is supported"),
      prediction: never("predicted outputs are not supported"),
      reasoning_effort: never("reasoning_effort is not supported: this model does not reason"),
      verbosity: never("verbosity is not supported"),
      web_search_options: never("web search is not supported"),
      echo: never("echo is not supported on chat completions"),
      add_generation_prompt: unless((v) => v === true, "add_generation_prompt: false is not supported"),
      continue_final_message: unless((v) => v === false, "continue_final_message is not supported"),
      chat_template: never("a per-request chat_template is not supported"),
      chat_template_kwargs: never("chat_template_kwargs is not supported"),
      documents: never("documents are not supported"),
      tool_call_parser: never("the tool-call parser is the engine's --tool-call-parser, not a request field"),
    }),
  ]),
  completion: new Map([
    ...REFUSED_COMMON,
    ...Object.entries<Refusal>({
      tools: never("tools are a chat completions field"),
      tool_choice: never("tool_choice is a chat completions field"),
      parallel_tool_calls: never("parallel_tool_calls is a chat completions field"),
    }),
  ]),
};

/** Checks the identity fields' shapes (they change nothing, so they must at least be what OpenAI allows). */
function checkIdentity(key: string, v: unknown): string | null {
  if (key === "store") return v === false ? null : "store: true is not supported (nothing is stored)";
  if (key === "service_tier") return v === "auto" || v === "default" ? null : `service_tier ${quote(v)} is not supported; "auto" or "default"`;
  if (key === "metadata") {
    const ok =
      typeof v === "object" &&
      !Array.isArray(v) &&
      Object.keys(v as object).length <= 16 &&
      Object.values(v as object).every((s) => typeof s === "string" && s.length <= 512);
    return ok ? null : "metadata must be an object of at most 16 string values of at most 512 characters";
  }
  return typeof v === "string" && v.length <= 512 ? null : `${key} must be a string of at most 512 characters`;
}

/**
 * Refuses every field this engine does not honour (400 naming it), before any work;
 * returns the unknown field names, which the caller serves with a warning.
 */
export function auditFields(kind: CompletionKind, body: Record<string, unknown>): string[] {
  const unknown: string[] = [];
  for (const [key, v] of Object.entries(body)) {
    if (v === null || v === undefined || IMPLEMENTED[kind].has(key)) continue;
    const refusal = REFUSED[kind].get(key);
    const why = IDENTITY.has(key) ? checkIdentity(key, v) : refusal ? refusal(v) : (unknown.push(key), null);
    if (why !== null) throw new HttpError(400, why.startsWith(key) ? why : `${key}: ${why}`, "invalid_request_error", key);
  }
  // Names only as far as they are safe in a header and a log line.
  const named = unknown.slice(0, 16).map((k) => (/^[A-Za-z0-9_.-]{1,64}$/.test(k) ? k : "?"));
  if (named.length > 0) log.warn("request fields ignored (unknown to this engine)", { fields: named });
  return named;
}
