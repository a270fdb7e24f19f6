import { promptHashes } from "../codec/index.ts";
import type { ClaimedHandle } from "../transfer/index.ts";
import type { Engine, Finish } from "../engine/index.ts";
import type { ChatRenderer, Tokenizer } from "../model/index.ts";
import { endSpan, extractHeaders, SpanKind, startSpan, type Attributes, type Span } from "../obs/index.ts";
import { parseCompletion, samplingOf, type CompletionKind, type CompletionParams } from "./completion-request.ts";
import { completionResponse } from "./completion-response.ts";
import { errorResponse, HttpError } from "./errors.ts";
import { TokenQueue } from "./token-queue.ts";


export interface EngineHttpContext {
  engine: Engine;
  tokenizer: Tokenizer;
  /** The model's chat template (default: DEFAULT_CHAT_TEMPLATE). */
  chat?: ChatRenderer;
  modelName: string;
  workerId: string;
  roles: readonly string[];
  isDraining: () => boolean;
  /** Decode engines: takes a pushed handle over (null when unknown or expired). */
  claim?: (handleId: string) => ClaimedHandle | null;
  /** Called once per finished request, for logs and metrics. */
  onRequestEnd?: (info: RequestEnd) => void;
  /** Extra routes (e.g. /metrics), tried before the 404. */
  extraRoutes?: (req: Request, url: URL) => Promise<Response | null> | Response | null;
}

export interface RequestEnd {
  requestId: string;
  kind: CompletionKind;
  resumed: boolean;
  promptTokens: number;
  outputTokens: number;
  prefixHitTokens: number;
  reason: string;
  ttftMs: number | null;
  durationMs: number;
}

export const HANDLE_HEADER = "x-tl-kv-handle";
export const FIRST_TOKEN_HEADER = "x-tl-first-token";
export const DRAWS_HEADER = "x-tl-rng-draws";

let counter = 0;
export function requestId(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}${(counter++).toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

async function readJson(req: Request): Promise<unknown> {
  try {
    return await req.json();
  } catch (e) {
    throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function headerInt(req: Request, name: string, max: number): number {
  const v = req.headers.get(name);
  if (v === null || !/^\d+$/.test(v) || Number(v) >= max) throw new HttpError(400, `${name} must be an integer in [0, ${max}), got ${JSON.stringify(v)}`);
  return Number(v);
}

/** OpenAI-compatible HTTP for one engine, including the decode side of the hand-off. */
export function engineHttpHandler(ctx: EngineHttpContext): (req: Request) => Promise<Response> {
  const { engine, tokenizer } = ctx;
  const limits = { tokenizer, maxModelLen: engine.maxModelLen, chat: ctx.chat };
  // Span attributes built once, so tracing off allocates nothing per request.
  const role = ctx.roles.length === 1 ? ctx.roles[0]! : "both";
  const serverAttrs: Record<CompletionKind, Attributes> = {
    completion: { "tl.role": role, "tl.worker_id": ctx.workerId, "http.request.method": "POST", "url.path": "/v1/completions" },
    chat: { "tl.role": role, "tl.worker_id": ctx.workerId, "http.request.method": "POST", "url.path": "/v1/chat/completions" },
  };
  const stepAttrs: Attributes = { "tl.role": role, "tl.worker_id": ctx.workerId };

  /**
   * A SERVER span (child of the caller's `traceparent`, the gateway's resume span) that
   * ends with the request, and under it the engine's work: "decode" for a resumed handle.
   */
  async function complete(req: Request, kind: CompletionKind): Promise<Response> {
    const span = startSpan(kind === "chat" ? "POST /v1/chat/completions" : "POST /v1/completions", SpanKind.SERVER, extractHeaders(req.headers), serverAttrs[kind]);
    try {
      return await completeTraced(req, kind, span);
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  async function completeTraced(req: Request, kind: CompletionKind, span: Span): Promise<Response> {
    if (ctx.isDraining()) throw new HttpError(503, "engine is draining", "server_error", null, { "retry-after": "1" });
    const params = parseCompletion(kind, await readJson(req), limits);
    if (params.model !== undefined && params.model !== ctx.modelName) {
      throw new HttpError(404, `model ${JSON.stringify(params.model)} not served here; this engine serves ${JSON.stringify(ctx.modelName)}`, "invalid_request_error", "model");
    }
    const handleId = req.headers.get(HANDLE_HEADER);
    const resume = handleId === null ? undefined : claimFor(req, handleId, params);
    const id = req.headers.get("x-request-id") ?? requestId(kind === "chat" ? "chatcmpl" : "cmpl");
    if (engine.has(id)) {
      if (resume) engine.pool.releaseAll(resume.blockIds);
      throw new HttpError(409, `request ${id} is already in flight`);
    }
    const q = new TokenQueue();
    const started = performance.now();
    let ttft: number | null = null;
    const step = startSpan(resume ? "decode" : "generate", SpanKind.INTERNAL, span, stepAttrs);
    if (span.isRecording()) span.setAttributes({ "tl.request_id": id, "tl.resumed": resume !== undefined, ...(handleId !== null ? { "tl.kv.handle": handleId } : {}) });
    const done = engine.submit({
      requestId: id,
      promptTokens: params.promptTokens,
      sampling: samplingOf(params),
      resume,
      onToken: (t) => {
        ttft ??= performance.now() - started;
        q.push(t);
      },
    });
    done.then((f: Finish) => {
      // A cancel the reader did not ask for (Cancel RPC, shutdown) must read as a failure, not an end.
      if (f.reason === "cancelled") q.close({ reason: "error", error: `request ${id} was cancelled on ${ctx.workerId}` });
      else q.close({ reason: f.reason === "prefilled" ? "stop" : f.reason, error: f.error });
      ctx.onRequestEnd?.({
        requestId: id,
        kind,
        resumed: resume !== undefined,
        promptTokens: f.promptTokens,
        outputTokens: f.outputTokens.length,
        prefixHitTokens: f.prefixHitTokens,
        reason: f.reason,
        ttftMs: ttft,
        durationMs: performance.now() - started,
      });
      if (step.isRecording()) step.setAttributes({ "tl.prompt_tokens": f.promptTokens, "tl.output_tokens": f.outputTokens.length, "tl.prefix_hit_tokens": f.prefixHitTokens, "tl.finish": f.reason });
      const failed = f.reason === "error" || f.reason === "cancelled" ? (f.error ?? f.reason) : undefined;
      endSpan(step, failed);
      endSpan(span, failed);
    });
    // Disconnects cancel the request wherever it is, which frees its blocks.
    req.signal.addEventListener("abort", () => engine.cancel(id));
    return completionResponse(q, {
      id,
      model: ctx.modelName,
      tokenizer,
      params,
      onStop: () => engine.cancel(id),
      onAbort: () => engine.cancel(id),
      headers: { "x-request-id": id, "x-tl-seed": params.seed.toString(), "x-tl-worker": ctx.workerId },
    });
  }

  /** The decode side of the hand-off: take the handle's blocks, or say why not. */
  function claimFor(req: Request, handleId: string, params: CompletionParams) {
    if (!ctx.claim) throw new HttpError(400, `${HANDLE_HEADER} sent to an engine without the decode role`);
    const firstToken = headerInt(req, FIRST_TOKEN_HEADER, tokenizer.vocabSize);
    const draws = headerInt(req, DRAWS_HEADER, 2 ** 31);
    const claimed = ctx.claim(handleId);
    if (!claimed) throw new HttpError(404, `kv handle ${JSON.stringify(handleId)} is unknown or expired`, "not_found_error");
    const B = engine.pool.shape.blockTokens;
    const want = promptHashes(params.promptTokens, B);
    const hashesMatch = want.length === claimed.hashes.length && want.every((h, i) => h === claimed.hashes[i]);
    if (!hashesMatch || claimed.nTokens !== params.promptTokens.length) {
      engine.pool.releaseAll(claimed.blockIds);
      throw new HttpError(
        409,
        `kv handle ${JSON.stringify(handleId)} holds ${claimed.nTokens} tokens in ${claimed.hashes.length} full blocks; the prompt has ${params.promptTokens.length} tokens and its block hashes ${hashesMatch ? "match" : "differ"}`,
        "conflict_error",
      );
    }
    return { blockIds: claimed.blockIds, firstToken, draws };
  }

  return async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    try {
      if (req.method === "POST" && url.pathname === "/v1/completions") return await complete(req, "completion");
      if (req.method === "POST" && url.pathname === "/v1/chat/completions") return await complete(req, "chat");
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return Response.json({
          object: "list",
          data: [{ id: ctx.modelName, object: "model", created: 0, owned_by: "tl-engine", max_model_len: engine.maxModelLen }],
        });
      }
      if (req.method === "GET" && url.pathname === "/health") {
        // Alive while draining (liveness must not restart it); the status says it takes no new work.
        return Response.json({ status: ctx.isDraining() ? "draining" : "ok", worker_id: ctx.workerId, roles: ctx.roles, model: ctx.modelName });
      }
      const extra = await ctx.extraRoutes?.(req, url);
      if (extra) return extra;
      throw new HttpError(404, `no route for ${req.method} ${url.pathname}`, "not_found_error");
    } catch (e) {
      return errorResponse(e);
    }
  };
}
