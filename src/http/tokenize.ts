import { chatRenderer, ChatTemplateError, type ChatRenderer, type Tokenizer } from "../tokenizer/index.ts";
import { parseMessages } from "./chat-messages.ts";
import { HttpError } from "./errors.ts";
import { checkInputBounds } from "./input-bounds.ts";

/** What /tokenize and /detokenize need: the served model's name, tokenizer, chat template and context. */
export interface TokenizeContext {
  modelName: string;
  tokenizer: Tokenizer;
  chat?: ChatRenderer;
  maxModelLen: number;
}

/**
 * vLLM's fields this server does not implement: refused by name when set to anything but their
 * default. Every other field is accepted and ignored, as vLLM's request models do, and named in
 * the x-tl-ignored-fields header.
 */
const REFUSED = new Map<string, (v: unknown) => boolean>([
  ["return_token_strs", (v) => v === true],
  ["add_generation_prompt", (v) => v === false],
  ["continue_final_message", (v) => v === true],
  ["chat_template", (v) => v !== null && v !== undefined],
  ["chat_template_kwargs", (v) => v !== null && v !== undefined],
  ["tools", (v) => v !== null && v !== undefined],
  ["mm_processor_kwargs", (v) => v !== null && v !== undefined],
]);
const TOKENIZE_FIELDS = new Set(["model", "prompt", "messages", "add_special_tokens"]);
const DETOKENIZE_FIELDS = new Set(["model", "tokens"]);

function bad(message: string, param: string | null = null): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

async function body(req: Request): Promise<Record<string, unknown>> {
  let raw: unknown;
  try {
    raw = await req.json();
  } catch (e) {
    throw bad(`request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw bad("request body must be a JSON object");
  return raw as Record<string, unknown>;
}

function checkModel(b: Record<string, unknown>, ctx: TokenizeContext): void {
  const m = b.model;
  if (m === undefined || m === null) return;
  if (typeof m !== "string") throw bad(`model must be a string, got ${JSON.stringify(m).slice(0, 80)}`, "model");
  if (m !== ctx.modelName)
    throw new HttpError(
      404,
      `model ${JSON.stringify(m.slice(0, 200))} not served here; this server serves ${JSON.stringify(ctx.modelName)}`,
      "invalid_request_error",
      "model",
    );
}

/** The fields served without effect; a refused one throws. */
function auditTokenizeFields(b: Record<string, unknown>, known: ReadonlySet<string>): string[] {
  const ignored: string[] = [];
  for (const key of Object.keys(b)) {
    if (known.has(key)) continue;
    const refused = REFUSED.get(key);
    if (refused?.(b[key])) throw bad(`${key} is not supported by this server`, key);
    if (!refused) ignored.push(key);
  }
  return ignored;
}

function respond(json: object, ignored: string[]): Response {
  return Response.json(json, ignored.length > 0 ? { headers: { "x-tl-ignored-fields": ignored.join(",").slice(0, 1024) } } : undefined);
}

/**
 * POST /tokenize, as vLLM: `{model?, prompt}` (`add_special_tokens`, default true: BOS as the model
 * adds it) or `{model?, messages}` (rendered with the model's chat template, as
 * /v1/chat/completions prefills it) → `{tokens, count, max_model_len}`. Bounded as a completion's
 * prompt is (characters per token, messages per context) before any tokenizing; a prompt longer
 * than the context is still counted, so a client can see by how much.
 */
export async function tokenizeRoute(req: Request, ctx: TokenizeContext): Promise<Response> {
  const b = await body(req);
  checkModel(b, ctx);
  const ignored = auditTokenizeFields(b, TOKENIZE_FIELDS);
  const hasPrompt = b.prompt !== undefined && b.prompt !== null;
  const hasMessages = b.messages !== undefined && b.messages !== null;
  if (hasPrompt === hasMessages) throw bad("give exactly one of prompt (a string) or messages (a chat)", hasPrompt ? "messages" : "prompt");
  const special = b.add_special_tokens;
  if (special !== undefined && special !== null && typeof special !== "boolean") throw bad("add_special_tokens must be a boolean", "add_special_tokens");
  let tokens: number[];
  if (hasPrompt) {
    if (typeof b.prompt !== "string") throw bad("prompt must be a string", "prompt");
    checkInputBounds("completion", b, ctx.maxModelLen);
    const bos = (special ?? true) && ctx.tokenizer.addBos;
    tokens = ctx.tokenizer.encode(b.prompt, { bos });
  } else {
    checkInputBounds("chat", b, ctx.maxModelLen);
    const messages = parseMessages(b.messages);
    try {
      tokens = (ctx.chat ?? chatRenderer(ctx.tokenizer, null)).promptTokens(messages);
    } catch (e) {
      if (e instanceof ChatTemplateError) throw bad(e.message, "messages");
      throw e;
    }
  }
  return respond({ tokens, count: tokens.length, max_model_len: ctx.maxModelLen }, ignored);
}

/**
 * POST /detokenize, as vLLM: `{model?, tokens}` → `{prompt}`, the ids' text (special tokens give
 * none). At most max_model_len ids, each in the vocabulary, checked before decoding.
 */
export async function detokenizeRoute(req: Request, ctx: TokenizeContext): Promise<Response> {
  const b = await body(req);
  checkModel(b, ctx);
  const ignored = auditTokenizeFields(b, DETOKENIZE_FIELDS);
  const ids = b.tokens;
  if (!Array.isArray(ids)) throw bad("tokens must be an array of token ids", "tokens");
  if (ids.length > ctx.maxModelLen) throw bad(`tokens has ${ids.length} ids; at most max_model_len (${ctx.maxModelLen})`, "tokens");
  const vocab = ctx.tokenizer.vocabSize;
  for (const t of ids) {
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t >= vocab)
      throw bad(`tokens holds ${JSON.stringify(t).slice(0, 40)}, not a token id in 0..${vocab - 1}`, "tokens");
  }
  return respond({ prompt: ctx.tokenizer.decode(ids as number[]) }, ignored);
}
