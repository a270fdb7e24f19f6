import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { KV_FORMAT } from "../codec/index.ts";
import { MAX_CHARS_PER_TOKEN, MAX_STOP_TOKEN_IDS, type Engine, type SamplingParams } from "../engine/index.ts";
import {
  CancelResponseSchema,
  DrainResponseSchema,
  type EngineControl,
  InfoResponseSchema,
  KvHandleSchema,
  type InfoResponse,
  type KvHandle,
  type PrefillRequest,
  type SamplingParams as SamplingProto,
  type SamplingParamsSchema,
} from "../gen/tl/engine/v1/engine_pb.ts";
import { grammarVocab, type Tokenizer } from "../tokenizer/index.ts";
import { type CompiledConstraint, compilerFor, ConstraintError, type ConstraintKind, type ConstraintSpec } from "../grammar/index.ts";
import { type Handoff, type PrefillPushContext, prefillAndPush } from "../handoff/index.ts";
import { endSpan, extractHeaders, SpanKind, startSpan, type Attributes } from "../obs/index.ts";
import { MAX_TOP_LOGPROBS, randomSeed, validateLogits, validateSampling } from "../rng/index.ts";
import { type KvTransport, MAX_OWNER_CHARS } from "../transfer/index.ts";
import { callerOf, type Caller } from "../rpc/peer-gate.ts";
import { formatIdentity, speaksFor } from "../rpc/peer-identity.ts";

const U64_MAX = (1n << 64n) - 1n;
/** Choices one Prefill may sample (the HTTP layer's bound on n). */
const MAX_CHOICES = 16;
const MAX_DRAIN_MS = 3_600_000n;

export interface ControlContext {
  workerId: string;
  roles: readonly ("prefill" | "decode")[];
  modelName: string;
  engine: Engine;
  tokenizer: Tokenizer;
  /** tokenizerFingerprint(tokenizer), reported by Info. */
  tokenizerFingerprint?: string;
  /** The model's parameter count, stored dtype and resident bytes, reported by Info. */
  modelStats?: { parameters: number; dtype: string; residentBytes: number };
  /** How this engine pushes KV to decode targets; required for the prefill role. */
  transport: KvTransport | null;
  /** Seconds-resolution observers for metrics and logs. */
  onTransfer?: PrefillPushContext["onTransfer"];
}

function invalid(message: string): ConnectError {
  return new ConnectError(message, Code.InvalidArgument);
}

/** Converts and checks SamplingParams; `seed` is chosen here when the request has none. */
function samplingFromProto(s: SamplingProto | undefined, chooseSeed: () => bigint, vocab = Infinity): SamplingParams {
  if (!s) throw invalid("sampling is required (max_tokens ≥ 1)");
  const temperature = s.temperature;
  const topP = s.topP === 0 ? 1 : s.topP;
  const problem = validateSampling({ temperature, topP, topK: s.topK });
  if (problem) throw invalid(`sampling: ${problem}`);
  if (!(topP > 0 && topP <= 1)) throw invalid(`sampling.top_p ${s.topP} outside (0, 1]`);
  if (s.maxTokens < 1) throw invalid(`sampling.max_tokens ${s.maxTokens}: want ≥ 1`);
  const seed = s.seed ?? chooseSeed();
  if (seed < 0n || seed > U64_MAX) throw invalid(`sampling.seed ${seed} outside [0, 2^64)`);
  const logitBias = new Map(Object.entries(s.logitBias).map(([k, v]) => [Number(k), v]));
  const processing = {
    presencePenalty: s.presencePenalty,
    frequencyPenalty: s.frequencyPenalty,
    repetitionPenalty: s.repetitionPenalty === 0 ? 1 : s.repetitionPenalty,
    logitBias,
  };
  const bad = validateLogits(processing, vocab);
  if (bad) throw invalid(`sampling: ${bad}`);
  if (s.minTokens > s.maxTokens) throw invalid(`sampling.min_tokens ${s.minTokens} > max_tokens ${s.maxTokens}`);
  if (s.topLogprobs !== undefined && s.topLogprobs > MAX_TOP_LOGPROBS) throw invalid(`sampling.top_logprobs ${s.topLogprobs} > ${MAX_TOP_LOGPROBS}`);
  return {
    temperature,
    topP,
    topK: s.topK,
    seed,
    maxTokens: s.maxTokens,
    stopTokenIds: [...s.stopTokenIds],
    ...processing,
    minTokens: s.minTokens,
    ignoreEos: s.ignoreEos,
    topLogprobs: s.topLogprobs,
  };
}

/** The engine's SamplingParams as EngineControl's message: the inverse of samplingFromProto. */
export function samplingToProto(s: SamplingParams): MessageInitShape<typeof SamplingParamsSchema> {
  return {
    temperature: s.temperature,
    topP: s.topP,
    topK: s.topK,
    seed: s.seed,
    maxTokens: s.maxTokens,
    stopTokenIds: [...s.stopTokenIds],
    presencePenalty: s.presencePenalty ?? 0,
    frequencyPenalty: s.frequencyPenalty ?? 0,
    repetitionPenalty: s.repetitionPenalty ?? 1,
    logitBias: Object.fromEntries(s.logitBias ?? []),
    minTokens: s.minTokens ?? 0,
    ignoreEos: s.ignoreEos ?? false,
    topLogprobs: s.topLogprobs,
  };
}

// Built once: tracing off allocates nothing per request.
const PREFILL_SERVER_ATTRS: Attributes = { "tl.role": "prefill", "rpc.system": "grpc", "rpc.service": "tl.engine.v1.EngineControl", "rpc.method": "Prefill" };

/**
 * A gateway binds handles to its own replica id only: on an mTLS port the id must be one
 * its certificate speaks for, itself or with a `.<incarnation>` suffix (gateway.ts), or one
 * replica could have another's handles freed early.
 */
function checkGatewayId(gatewayId: string, caller: Caller): void {
  if (caller === undefined || caller.role !== "gateway" || gatewayId === "") return;
  const dot = gatewayId.lastIndexOf(".");
  if (!(speaksFor(caller, gatewayId) || (dot > 0 && speaksFor(caller, gatewayId.slice(0, dot))))) {
    throw new ConnectError(`gateway_id ${JSON.stringify(gatewayId)} is not the caller's (${formatIdentity(caller)})`, Code.PermissionDenied);
  }
}

/** Every check of grpc-services.md, "What Prefill refuses", on a PrefillRequest, before any work: the prompt's tokens and the sampling to use. */
function validatePrefill(ctx: ControlContext, req: PrefillRequest): { tokens: number[]; sampling: SamplingParams } {
  const { engine, tokenizer } = ctx;
  if (!ctx.roles.includes("prefill") || ctx.transport === null) {
    throw new ConnectError(`worker ${ctx.workerId} has no prefill role (roles: ${ctx.roles.join(", ")})`, Code.FailedPrecondition);
  }
  if (engine.isDraining) throw new ConnectError(`worker ${ctx.workerId} is draining`, Code.Unavailable);
  if (req.requestId === "") throw invalid("request_id is empty");
  if (req.requestId.length > 256) throw invalid(`request_id of ${req.requestId.length} characters; at most 256`);
  if (req.decodeTarget === "") throw invalid("decode_target is empty");
  if (req.decodeTarget.length > 300) throw invalid(`decode_target of ${req.decodeTarget.length} characters is not a host:port`);
  if (req.gatewayId.length > MAX_OWNER_CHARS) throw invalid(`gateway_id of ${req.gatewayId.length} characters; at most ${MAX_OWNER_CHARS}`);
  // Sizes first: what cannot fit the context is refused before it is scanned or tokenized.
  if (req.promptTokens.length > engine.maxModelLen) throw invalid(`prompt of ${req.promptTokens.length} tokens exceeds max_model_len ${engine.maxModelLen}`);
  if (req.prompt.length > engine.maxModelLen * MAX_CHARS_PER_TOKEN)
    throw invalid(`prompt of ${req.prompt.length} characters cannot fit max_model_len ${engine.maxModelLen}`);
  if ((req.sampling?.stopTokenIds.length ?? 0) > MAX_STOP_TOKEN_IDS)
    throw invalid(`sampling.stop_token_ids has ${req.sampling!.stopTokenIds.length} entries; at most ${MAX_STOP_TOKEN_IDS}`);
  const hasTokens = req.promptTokens.length > 0;
  const hasText = req.prompt !== "";
  if (hasTokens === hasText) throw invalid(`exactly one of prompt_tokens and prompt must be set (got ${hasTokens ? "both" : "neither"})`);
  const vocab = tokenizer.vocabSize;
  const sampling = samplingFromProto(req.sampling, randomSeed, vocab);
  if (req.kvFormat !== KV_FORMAT) throw new ConnectError(`kv_format ${req.kvFormat} not supported; this engine speaks ${KV_FORMAT}`, Code.FailedPrecondition);
  const bad = req.promptTokens.findIndex((t) => t >= vocab);
  if (bad >= 0) throw invalid(`prompt_tokens[${bad}] = ${req.promptTokens[bad]} ≥ vocab size ${vocab}`);
  const tokens = hasTokens ? [...req.promptTokens] : tokenizer.encode(req.prompt);
  if (tokens.length + sampling.maxTokens > engine.maxModelLen) {
    throw invalid(`prompt (${tokens.length} tokens) + max_tokens (${sampling.maxTokens}) exceeds max_model_len ${engine.maxModelLen}`);
  }
  if (req.n > MAX_CHOICES) throw invalid(`n ${req.n} > ${MAX_CHOICES}`);
  if (engine.has(req.requestId)) throw new ConnectError(`request ${req.requestId} already in flight`, Code.AlreadyExists);
  return { tokens, sampling };
}

/**
 * PrefillRequest.structured, compiled on this engine (cached per grammar): INVALID_ARGUMENT
 * naming why when it cannot be, before any prefill; null when the request has none.
 */
async function compileStructured(ctx: ControlContext, req: PrefillRequest): Promise<CompiledConstraint | null> {
  const so = req.structured;
  if (so === undefined) return null;
  const spec: ConstraintSpec = { kind: so.kind as ConstraintKind, source: so.source };
  const compiler = await compilerFor(ctx.tokenizer, () => grammarVocab(ctx.tokenizer, ctx.engine.model.vocabSize));
  try {
    return await compiler.compile(spec);
  } catch (e) {
    if (e instanceof ConstraintError) throw invalid(`structured: ${e.message}`);
    throw e;
  }
}

/** The hand-off as the KvHandle message; `constraintHash` names the structured output its first tokens were sampled under. */
function kvHandleOf(h: Handoff, constraintHash = ""): KvHandle {
  const out = h.prefill;
  return create(KvHandleSchema, {
    constraintHash,
    handleId: h.handleId,
    firstToken: out.firstToken,
    blockHashes: out.hashes,
    rngDrawsConsumed: out.draws,
    promptTokens: h.promptTokens,
    seed: h.seed,
    finished: out.finished,
    firstTokenLogprob: out.firstLogprobs?.logprob,
    firstTopLogprobs: out.firstLogprobs?.top.map(([token, logprob]) => ({ token, logprob })) ?? [],
    ...(out.choices.length > 1
      ? {
          choiceFirstTokens: out.choices.map((c) => c.token),
          choiceFirstLogprobs: out.firstLogprobs ? out.choices.map((c) => c.logprobs!.logprob) : [],
          choiceFinished: out.choices.map((c) => c.finished),
        }
      : {}),
    blocksSent: h.stats?.blocksSent ?? 0,
    blocksDeduped: h.stats?.blocksDeduped ?? 0,
    payloadBytes: BigInt(h.stats?.payloadBytes ?? 0),
  });
}

function infoOf(ctx: ControlContext): InfoResponse {
  const { engine } = ctx;
  const pool = engine.pool;
  return create(InfoResponseSchema, {
    workerId: ctx.workerId,
    roles: [...ctx.roles],
    model: ctx.modelName,
    kvFormat: KV_FORMAT,
    blockTokens: pool.shape.blockTokens,
    nLayers: pool.shape.nLayers,
    nKvHeads: pool.shape.nKvHeads,
    headDim: pool.shape.headDim,
    totalBlocks: pool.total,
    freeBlocks: pool.total - pool.used,
    queueDepth: engine.queueDepth,
    running: engine.runningCount,
    draining: engine.isDraining,
    maxModelLen: engine.maxModelLen,
    vocabSize: ctx.tokenizer.vocabSize,
    tokenizerFingerprint: ctx.tokenizerFingerprint ?? "",
    parameters: BigInt(ctx.modelStats?.parameters ?? 0),
    dtype: ctx.modelStats?.dtype ?? "",
    residentBytes: BigInt(ctx.modelStats?.residentBytes ?? 0),
  });
}

/** EngineControl over one engine, a thin adapter: Prefill (prefillAndPush), Info, Cancel, Drain. */
export function controlService(ctx: ControlContext): ServiceImpl<typeof EngineControl> {
  const { engine } = ctx;
  return {
    /** Traced as a SERVER span (parent from the caller's `traceparent` metadata) around the hand-off. */
    async prefill(req, callCtx): Promise<KvHandle> {
      const span = startSpan("tl.engine.v1.EngineControl/Prefill", SpanKind.SERVER, extractHeaders(callCtx.requestHeader), PREFILL_SERVER_ATTRS);
      if (span.isRecording()) span.setAttributes({ "tl.worker_id": ctx.workerId, "tl.request_id": req.requestId });
      try {
        const { tokens, sampling } = validatePrefill(ctx, req);
        checkGatewayId(req.gatewayId, callerOf(callCtx));
        const compiled = await compileStructured(ctx, req);
        const constraint = compiled
          ? await (await compilerFor(ctx.tokenizer, () => grammarVocab(ctx.tokenizer, engine.model.vocabSize))).matcher(compiled)
          : undefined;
        const push: PrefillPushContext = { engine, transport: ctx.transport!, ...(ctx.onTransfer ? { onTransfer: ctx.onTransfer } : {}) };
        const h = await prefillAndPush(push, {
          requestId: req.requestId,
          promptTokens: tokens,
          sampling,
          choices: Math.max(1, req.n),
          decodeTarget: req.decodeTarget,
          ...(req.gatewayId !== "" ? { owner: req.gatewayId } : {}),
          signal: callCtx.signal,
          parent: span,
          ...(constraint ? { constraint } : {}),
        });
        endSpan(span);
        return kvHandleOf(h, compiled?.hash);
      } catch (e) {
        endSpan(span, e);
        // A HandoffError is answered with its code and its side (FAILED_SIDE_HEADER) as is.
        throw e;
      }
    },

    info() {
      return infoOf(ctx);
    },

    cancel(req) {
      return create(CancelResponseSchema, { cancelled: engine.cancel(req.requestId) });
    },

    /**
     * Stops admitting for good (readiness turns 503), lets running requests finish until
     * deadline_ms, then cuts what is left: the deadline is honoured, not just reported.
     */
    async drain(req) {
      if (req.deadlineMs > MAX_DRAIN_MS) throw invalid(`deadline_ms ${req.deadlineMs} exceeds ${MAX_DRAIN_MS} (one hour)`);
      const remaining = await engine.drain(Number(req.deadlineMs));
      for (const id of engine.requestIds()) engine.cancel(id);
      return create(DrainResponseSchema, { remaining });
    },
  };
}
