import { claimForResume, ResumeError } from "../handoff/index.ts";
import type { KvReceiver } from "../transfer/index.ts";
import type { Engine, Finish } from "../engine/index.ts";
import { type CompiledConstraint, compilerFor, ConstraintError, constraintHash, type ConstraintSpec, type TokenMatcher } from "../grammar/index.ts";
import { type ChatRenderer, grammarVocab, type Tokenizer } from "../tokenizer/index.ts";
import { endSpan, extractHeaders, log, SpanKind, startSpan, type Attributes, type Span } from "../obs/index.ts";
import { LIMITS, parseCompletion, samplingOf, type CompletionParams } from "./completion-request.ts";
import type { CompletionKind } from "./openai-params.ts";
import { completionResponse } from "./completion-response.ts";
import { errorResponse, HttpError } from "./errors.ts";
import { TokenQueue } from "./token-queue.ts";
import type { ToolParserName } from "./tool-calls.ts";
import { detokenizeRoute, type TokenizeContext, tokenizeRoute } from "./tokenize.ts";
import { quote } from "../codec/index.ts";

export interface EngineHttpContext {
  engine: Engine;
  tokenizer: Tokenizer;
  /** The model's chat template (default: DEFAULT_CHAT_TEMPLATE). */
  chat?: ChatRenderer;
  modelName: string;
  /** Listed beside the model in /v1/models when known. */
  modelStats?: { parameters: number; dtype: string; residentBytes: number };
  workerId: string;
  roles: readonly string[];
  isDraining: () => boolean;
  /** What /health reports as the internal ports' mode. */
  tls?: "mtls" | "plaintext";
  /** Decode engines: where pushed handles wait for their resume (claimForResume). */
  receiver?: KvReceiver | null;
  /** Called once per finished request, for logs and metrics. */
  onRequestEnd?: (info: RequestEnd) => void;
  /** Extra routes (e.g. /metrics), tried before the 404. */
  extraRoutes?: (req: Request, url: URL) => Promise<Response | null> | Response | null;
  /** --tool-call-parser (default: what the chat template shows). */
  toolParser?: ToolParserName | null;
}

export interface RequestEnd {
  requestId: string;
  /** The client's x-request-id, if it sent one (the gateway's internal id when the gateway did). */
  clientRequestId?: string;
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
/** n > 1 resumes: each choice's seed offset (choice j samples from seed + j), comma-separated. */
export const CHOICES_HEADER = "x-tl-choices";
/** A constrained resume: KvHandle.constraint_hash, the identity of the grammar P sampled the first token under. */
export const CONSTRAINT_HEADER = "x-tl-constraint";

/**
 * The engine's compiled constraint for a request (one compile per grammar and tokenizer,
 * cached), or a 400 naming why it cannot be built; before any prefill or claim.
 */
async function compileFor(tokenizer: Tokenizer, vocabSize: number, spec: ConstraintSpec): Promise<CompiledConstraint> {
  const compiler = await compilerFor(tokenizer, () => grammarVocab(tokenizer, vocabSize));
  try {
    return await compiler.compile(spec);
  } catch (e) {
    if (e instanceof ConstraintError) throw new HttpError(400, `structured output: ${e.message}`, "invalid_request_error", "response_format");
    throw e;
  }
}

/** One fresh matcher per choice of a compiled constraint. */
async function matchersFor(tokenizer: Tokenizer, vocabSize: number, c: CompiledConstraint, n: number): Promise<TokenMatcher[]> {
  const compiler = await compilerFor(tokenizer, () => grammarVocab(tokenizer, vocabSize));
  const out: TokenMatcher[] = [];
  try {
    for (let i = 0; i < n; i++) out.push(await compiler.matcher(c));
  } catch (e) {
    for (const m of out) m.dispose();
    throw e;
  }
  return out;
}

/** One resumed choice: its blocks, its first token, and its seed offset (choice j: seed + j). */
type ResumeKv = { blockIds: number[]; firstToken: number; draws: number; choice: number };

/** The engine's request id of each choice: the request's own when there is one choice. */
function choiceIds(id: string, choices: number): string[] {
  return choices === 1 ? [id] : Array.from({ length: choices }, (_, i) => `${id}-${i}`);
}

let counter = 0;
export function requestId(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}${(counter++).toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

/** Longest client x-request-id kept; a longer one is refused (it lands in every log line). */
const MAX_CLIENT_REQUEST_ID = 256;

/**
 * The client's x-request-id, kept for logs, traces and the response's x-request-id header. It is
 * never the request's internal id (that one is always minted here, unique), so two clients, or a
 * retry, sending the same id do not collide: the later request is served, not refused.
 */
export function clientRequestId(req: Request): string | undefined {
  const v = req.headers.get("x-request-id");
  if (v === null || v === "") return undefined;
  if (v.length > MAX_CLIENT_REQUEST_ID || !/^[\x21-\x7e]+$/.test(v))
    throw new HttpError(400, `x-request-id must be 1-${MAX_CLIENT_REQUEST_ID} printable ASCII characters without spaces`, "invalid_request_error");
  return v;
}

async function readJson(req: Request): Promise<unknown> {
  try {
    return await req.json();
  } catch (e) {
    throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** A header of `n` comma-separated integers in [0, max); `dflt` when absent. */
function headerInts(req: Request, name: string, n: number, max: number, dflt?: number[]): number[] {
  const v = req.headers.get(name);
  if (v === null && dflt) return dflt;
  const parts = v === null ? [] : v.split(",");
  if (parts.length !== n || parts.some((p) => !/^\d{1,10}$/.test(p) || Number(p) >= max)) {
    throw new HttpError(400, `${name} must be ${n} comma-separated integers in [0, ${max}) (one per choice), got ${quote(v)}`);
  }
  return parts.map(Number);
}

function headerInt(req: Request, name: string, max: number): number {
  const v = req.headers.get(name);
  if (v === null || !/^\d+$/.test(v) || Number(v) >= max) throw new HttpError(400, `${name} must be an integer in [0, ${max}), got ${quote(v)}`);
  return Number(v);
}

/** OpenAI-compatible HTTP for one engine, including the decode side of the hand-off. */
export function engineHttpHandler(ctx: EngineHttpContext): (req: Request) => Promise<Response> {
  const http = new EngineHttp(ctx);
  return (req) => http.handle(req);
}

class EngineHttp {
  private readonly engine: Engine;
  private readonly tokenizer: Tokenizer;
  private readonly limits: { tokenizer: Tokenizer; maxModelLen: number; chat: ChatRenderer | undefined; toolParser: ToolParserName | null };
  private readonly tokenize: TokenizeContext;
  // Span attributes built once, so tracing off allocates nothing per request.
  private readonly serverAttrs: Record<CompletionKind, Attributes>;
  private readonly stepAttrs: Attributes;

  constructor(private readonly ctx: EngineHttpContext) {
    const { engine, tokenizer } = ctx;
    this.engine = engine;
    this.tokenizer = tokenizer;
    this.limits = { tokenizer, maxModelLen: engine.maxModelLen, chat: ctx.chat, toolParser: ctx.toolParser ?? null };
    this.tokenize = { modelName: ctx.modelName, ...this.limits };
    const role = ctx.roles.length === 1 ? ctx.roles[0]! : "both";
    this.serverAttrs = {
      completion: { "tl.role": role, "tl.worker_id": ctx.workerId, "http.request.method": "POST", "url.path": "/v1/completions" },
      chat: { "tl.role": role, "tl.worker_id": ctx.workerId, "http.request.method": "POST", "url.path": "/v1/chat/completions" },
    };
    this.stepAttrs = { "tl.role": role, "tl.worker_id": ctx.workerId };
  }

  async handle(req: Request): Promise<Response> {
    const { ctx, engine } = this;
    const url = new URL(req.url);
    try {
      if (req.method === "POST" && url.pathname === "/v1/completions") return await this.complete(req, "completion");
      if (req.method === "POST" && url.pathname === "/v1/chat/completions") return await this.complete(req, "chat");
      if (req.method === "POST" && url.pathname === "/tokenize") return await tokenizeRoute(req, this.tokenize);
      if (req.method === "POST" && url.pathname === "/detokenize") return await detokenizeRoute(req, this.tokenize);
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return Response.json({
          object: "list",
          data: [{ id: ctx.modelName, object: "model", created: 0, owned_by: "tl-engine", max_model_len: engine.maxModelLen, ...statsFields(ctx.modelStats) }],
        });
      }
      if (req.method === "GET" && url.pathname === "/health") {
        // Readiness: 503 while draining, so a Service stops sending it work.
        const draining = ctx.isDraining();
        return Response.json(
          { status: draining ? "draining" : "ok", worker_id: ctx.workerId, roles: ctx.roles, model: ctx.modelName, tls: ctx.tls ?? "plaintext" },
          { status: draining ? 503 : 200 },
        );
      }
      // Liveness stays up while draining: restarting an engine that is finishing its work would cut it.
      if (req.method === "GET" && url.pathname === "/health/live") return Response.json({ status: "alive" });
      const extra = await ctx.extraRoutes?.(req, url);
      if (extra) return extra;
      throw new HttpError(404, `no route for ${req.method} ${quote(url.pathname)}`, "not_found_error");
    } catch (e) {
      return errorResponse(e);
    }
  }

  /**
   * A SERVER span (child of the caller's `traceparent`, the gateway's resume span) that
   * ends with the request, and under it the engine's work: "decode" for a resumed handle.
   */
  private async complete(req: Request, kind: CompletionKind): Promise<Response> {
    const { serverAttrs } = this;
    const span = startSpan(
      kind === "chat" ? "POST /v1/chat/completions" : "POST /v1/completions",
      SpanKind.SERVER,
      extractHeaders(req.headers),
      serverAttrs[kind],
    );
    try {
      return await this.completeTraced(req, kind, span);
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  private async completeTraced(req: Request, kind: CompletionKind, span: Span): Promise<Response> {
    const { ctx, engine, tokenizer, limits } = this;
    if (ctx.isDraining()) throw new HttpError(503, "engine is draining", "server_error", null, { "retry-after": "1" });
    const params = parseCompletion(kind, await readJson(req), limits);
    if (params.model !== undefined && params.model !== ctx.modelName) {
      throw new HttpError(404, `model ${quote(params.model)} not served here; this engine serves ${quote(ctx.modelName)}`, "invalid_request_error", "model");
    }
    const clientId = clientRequestId(req);
    const handleId = req.headers.get(HANDLE_HEADER);
    if (handleId !== null && params.prompts.length > 1)
      throw new HttpError(400, `a resume (${HANDLE_HEADER}) continues one prompt`, "invalid_request_error", "prompt");
    if (handleId !== null) this.checkConstraintHeader(req, params.constraint);
    const compiledNow = params.constraint && handleId === null ? await compileFor(tokenizer, engine.model.vocabSize, params.constraint) : null;
    const resumes = handleId === null ? undefined : this.claimFor(req, handleId, params);
    const id = requestId(kind === "chat" ? "chatcmpl" : "cmpl");
    const ids = choiceIds(id, params.prompts.length * params.n);
    let matchers: TokenMatcher[] | null = null;
    if (params.constraint) {
      try {
        const compiled = compiledNow ?? (await this.compileForResume(params.constraint));
        matchers = await matchersFor(tokenizer, engine.model.vocabSize, compiled, ids.length);
      } catch (e) {
        // The claimed blocks go back: the gateway serves the request elsewhere.
        for (const r of resumes ?? []) engine.pool.releaseAll(r.blockIds);
        throw e;
      }
    }
    if (span.isRecording())
      span.setAttributes({
        "tl.request_id": id,
        ...(clientId !== undefined ? { "tl.client_request_id": clientId } : {}),
        "tl.resumed": resumes !== undefined,
        ...(handleId !== null ? { "tl.kv.handle": handleId } : {}),
      });
    let left = ids.length;
    let failure: string | undefined;
    const choiceDone = (failed: string | undefined) => {
      failure ??= failed;
      if (--left === 0) endSpan(span, failure);
    };
    const queues = ids.map((cid, i) => this.generate(cid, clientId, i, params, kind, resumes?.[i], span, choiceDone, matchers?.[i]));
    const cancelAll = () => ids.forEach((c) => engine.cancel(c));
    // Disconnects cancel the request wherever it is, which frees its blocks.
    req.signal.addEventListener("abort", cancelAll);
    return completionResponse(queues, {
      id,
      model: ctx.modelName,
      tokenizer,
      params,
      onStop: (i) => engine.cancel(ids[i]!),
      onAbort: cancelAll,
      emittedBefore: resumes ? 1 : 0,
      headers: {
        "x-request-id": clientId ?? id,
        "x-tl-seed": params.seed.toString(),
        "x-tl-worker": ctx.workerId,
        ...(params.ignoredFields.length > 0 ? { "x-tl-ignored-fields": params.ignoredFields.join(",") } : {}),
      },
    });
  }

  /**
   * Submits choice `index` (prompt ⌊index / n⌋, seed + index mod n as vLLM) and returns
   * the queue its tokens arrive in; `onDone` runs when it finished, with why it failed.
   */
  private generate(
    id: string,
    clientId: string | undefined,
    index: number,
    params: CompletionParams,
    kind: CompletionKind,
    resume: ResumeKv | undefined,
    span: Span,
    onDone: (failed: string | undefined) => void,
    constraint: TokenMatcher | undefined,
  ): TokenQueue {
    const { ctx, engine, stepAttrs } = this;
    const q = new TokenQueue();
    const started = performance.now();
    let ttft: number | null = null;
    const step = startSpan(resume ? "decode" : "generate", SpanKind.INTERNAL, span, stepAttrs);
    const done = engine.submit({
      requestId: id,
      promptTokens: params.prompts[Math.floor(index / params.n)]!,
      sampling: samplingOf(params, resume ? resume.choice : index % params.n),
      resume,
      ...(constraint ? { constraint } : {}),
      onToken: (t, lp) => {
        ttft ??= performance.now() - started;
        q.push(t, lp);
      },
    });
    done.then((f: Finish) => {
      // A cancel the reader did not ask for (Cancel RPC, shutdown) must read as a failure, not an end.
      if (f.reason === "cancelled") q.close({ reason: "error", error: `request ${id} was cancelled on ${ctx.workerId}` });
      else q.close({ reason: f.reason === "prefilled" ? "stop" : f.reason, error: f.error });
      ctx.onRequestEnd?.({
        requestId: id,
        ...(clientId !== undefined ? { clientRequestId: clientId } : {}),
        kind,
        resumed: resume !== undefined,
        promptTokens: f.promptTokens,
        outputTokens: f.outputTokens.length,
        prefixHitTokens: f.prefixHitTokens,
        reason: f.reason,
        ttftMs: ttft,
        durationMs: performance.now() - started,
      });
      if (step.isRecording())
        step.setAttributes({
          "tl.prompt_tokens": f.promptTokens,
          "tl.output_tokens": f.outputTokens.length,
          "tl.prefix_hit_tokens": f.prefixHitTokens,
          "tl.finish": f.reason,
        });
      const failed = f.reason === "error" || f.reason === "cancelled" ? (f.error ?? f.reason) : undefined;
      endSpan(step, failed);
      onDone(failed);
    });
    return q;
  }

  /**
   * A resume continues under the grammar P sampled its first token with: the body's
   * constraint must be the one whose identity the handle carries (x-tl-constraint), checked
   * before the claim, so a mismatch leaves the handle pending (400).
   */
  private checkConstraintHeader(req: Request, spec: ConstraintSpec | null): void {
    const want = req.headers.get(CONSTRAINT_HEADER) ?? "";
    const have = spec ? constraintHash(spec) : "";
    if (want !== have)
      throw new HttpError(400, `${CONSTRAINT_HEADER} ${quote(want, 64)} is not the identity of this request's structured output`, "invalid_request_error");
  }

  /**
   * The decode side's compile, after the claim: a grammar this engine cannot build is a 412
   * (gRPC's FAILED_PRECONDITION: this engine cannot continue it, another may), and the caller
   * gives the claimed blocks back.
   */
  private async compileForResume(spec: ConstraintSpec): Promise<CompiledConstraint> {
    try {
      return await compileFor(this.tokenizer, this.engine.model.vocabSize, spec);
    } catch (e) {
      if (e instanceof HttpError && e.status === 400)
        throw new HttpError(412, `this engine cannot continue the request's structured output: ${e.message}`, "failed_precondition");
      throw e;
    }
  }

  /**
   * The decode side of the hand-off: take the handle's blocks, or say why not. With n > 1
   * (one prefill for n choices) the first tokens and the choices' seed offsets come as
   * comma-separated headers, and each choice after the first shares the prompt's blocks.
   */
  private claimFor(req: Request, handleId: string, params: CompletionParams): ResumeKv[] {
    const { ctx, engine, tokenizer } = this;
    if (!ctx.receiver) throw new HttpError(400, `${HANDLE_HEADER} sent to an engine without the decode role`);
    const firstTokens = headerInts(req, FIRST_TOKEN_HEADER, params.n, tokenizer.vocabSize);
    const choices = headerInts(
      req,
      CHOICES_HEADER,
      params.n,
      LIMITS.n,
      Array.from({ length: params.n }, (_, i) => i),
    );
    const draws = headerInt(req, DRAWS_HEADER, 2 ** 31);
    let blockIdsOfHandle: number[];
    try {
      blockIdsOfHandle = claimForResume(ctx.receiver, handleId, params.promptTokens);
    } catch (e) {
      if (!(e instanceof ResumeError)) throw e;
      throw e.kind === "unknown" ? new HttpError(404, e.rawMessage, "not_found_error") : new HttpError(409, e.rawMessage, "conflict_error");
    }
    const claimed = { blockIds: blockIdsOfHandle, nTokens: params.promptTokens.length };
    const out: ResumeKv[] = [{ blockIds: claimed.blockIds, firstToken: firstTokens[0]!, draws, choice: choices[0]! }];
    for (let i = 1; i < params.n; i++) {
      const blockIds = engine.sharePrompt(claimed.blockIds, claimed.nTokens);
      if (blockIds === null) {
        for (const r of out) engine.pool.releaseAll(r.blockIds);
        // Pool figures stay in the logs and /metrics: the error goes to a client.
        log.warn("resume: out of KV blocks for its choices", { choices: params.n, available: engine.pool.available });
        throw new HttpError(503, `out of KV blocks: ${params.n} choices need ${params.n - 1} more tail blocks`, "server_error", null, { "retry-after": "1" });
      }
      out.push({ blockIds, firstToken: firstTokens[i]!, draws, choice: choices[i]! });
    }
    return out;
  }
}

function statsFields(s: EngineHttpContext["modelStats"]): Record<string, unknown> {
  return s ? { parameters: s.parameters, dtype: s.dtype, resident_bytes: s.residentBytes } : {};
}
