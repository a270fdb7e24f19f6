import type { Engine, PrefillOutput, SamplingParams } from "../engine/index.ts";
import type { TokenMatcher } from "../grammar/index.ts";
import { endSpan, type Span, SpanKind, startSpan, traceparentOf } from "../obs/index.ts";
import { Code, ConnectError } from "../rpc/status.ts";
import { type KvTransport, TransferError, type TransferStats, transfer } from "../transfer/index.ts";
import { HandoffError } from "./handoff-error.ts";
import { releaseUnclaimed } from "./release.ts";

export interface PrefillPushContext {
  engine: Engine;
  /** How this engine pushes KV to decode targets. */
  transport: KvTransport;
  /** Hears every push's outcome, for metrics and logs. */
  onTransfer?: (outcome: { stats: TransferStats | null; code: Code | null; ms: number; target: string }) => void;
}

/** One prefill-then-push, its inputs already checked. */
export interface PrefillPushRequest {
  requestId: string;
  promptTokens: number[];
  sampling: SamplingParams;
  /** choices sampled from the one prefill (n), each its first token from stream(seed + j) */
  choices: number;
  /** KvTransfer host:port of the decode engine */
  decodeTarget: string;
  /** the gateway replica asking: D binds the handle to it and frees it early once that replica is gone */
  owner?: string;
  /** the caller going away: cancels the prefill, and a push it outlives is given back */
  signal: AbortSignal;
  /** the span the prefill and kv.transfer spans hang under */
  parent: Span;
  /** a structured output's matcher: the first tokens are sampled under it (the engine owns it from here) */
  constraint?: TokenMatcher;
}

/** What the decode side resumes from (the KvHandle message, transport-neutral). */
export interface Handoff {
  handleId: string;
  /** the engine's prefill: first tokens (one per choice), block hashes, draws; its block ids are consumed by the push */
  prefill: PrefillOutput;
  promptTokens: number[];
  seed: bigint;
  /** the push's numbers; null when nothing was pushed (every choice ended with its first token) */
  stats: TransferStats | null;
}

/**
 * A handle id is a capability to D's blocks: 128 random bits, nothing the client chose
 * (not its x-request-id) and nothing guessable.
 */
function newHandleId(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString("hex");
}

// Built once: tracing off allocates nothing per request.
const ROLE_ATTRS = { "tl.role": "prefill" };

/**
 * The prefill engine's half of one request's trip: prefill the prompt and sample token
 * 1, mint the handle, push the blocks to the decode target, hand the handle back. The
 * engine's references on the blocks are consumed on every path (transfer() drops them);
 * a handle D may hold that nobody will claim (the push failed after D accepted it, or
 * the caller left during it) is given back. Every failure is a HandoffError naming the
 * side that failed.
 */
export async function prefillAndPush(ctx: PrefillPushContext, req: PrefillPushRequest): Promise<Handoff> {
  const out = await prefill(ctx.engine, req);
  const handoff: Handoff = {
    handleId: newHandleId(),
    prefill: out,
    promptTokens: req.promptTokens,
    seed: req.sampling.seed,
    stats: null,
  };
  if (out.finished) return handoff;
  handoff.stats = await push(ctx, req, handoff.handleId, out.blockIds, out.hashes);
  if (!req.signal.aborted) return handoff;
  // The caller went away during the push: it will never resume or release this handle.
  releaseUnclaimed(ctx.transport, req.decodeTarget, handoff.handleId);
  throw new HandoffError("prefill", Code.Canceled, `request ${req.requestId} cancelled during the kv transfer`);
}

/** The engine's prefill-only pass under its own span; cancelled with the caller. */
async function prefill(engine: Engine, req: PrefillPushRequest) {
  const onAbort = () => engine.cancel(req.requestId);
  req.signal.addEventListener("abort", onAbort);
  const step = startSpan("prefill", SpanKind.INTERNAL, req.parent, ROLE_ATTRS);
  let f;
  try {
    f = await engine.submit({
      requestId: req.requestId,
      promptTokens: req.promptTokens,
      sampling: req.sampling,
      prefillOnly: true,
      choices: req.choices,
      ...(req.constraint ? { constraint: req.constraint } : {}),
    });
    if (step.isRecording())
      step.setAttributes({ "tl.prompt_tokens": req.promptTokens.length, "tl.prefix_hit_tokens": f.prefixHitTokens, "tl.finish": f.reason });
  } finally {
    req.signal.removeEventListener("abort", onAbort);
    endSpan(step);
  }
  if (f.reason === "cancelled") throw new HandoffError("prefill", Code.Canceled, `request ${req.requestId} cancelled`);
  if (!f.prefill) {
    // A request whose own settings left no token to sample is its caller's mistake (400 at the
    // gateway), not a full engine to retry later (429).
    const code =
      f.errorKind === "request"
        ? Code.InvalidArgument
        : f.errorKind === "model"
          ? Code.Internal
          : f.reason === "error" || f.reason === "length"
            ? Code.ResourceExhausted
            : Code.Internal;
    throw new HandoffError("prefill", code, `prefill failed: ${f.error ?? f.reason}`);
  }
  return f.prefill;
}

/** transfer() under a kv.transfer CLIENT span (D's SERVER span is its child); a failure is the decode side's. */
async function push(ctx: PrefillPushContext, req: PrefillPushRequest, handleId: string, blockIds: number[], hashes: bigint[]): Promise<TransferStats> {
  const target = req.decodeTarget;
  const started = performance.now();
  const span = startSpan("kv.transfer", SpanKind.CLIENT, req.parent, ROLE_ATTRS);
  if (span.isRecording()) span.setAttributes({ "server.address": target, "tl.kv.handle": handleId, "tl.kv.blocks": blockIds.length });
  try {
    const stats = await transfer(ctx.transport, target, ctx.engine.pool, handleId, blockIds, hashes, traceparentOf(span), req.owner);
    if (span.isRecording())
      span.setAttributes({ "tl.kv.blocks_sent": stats.blocksSent, "tl.kv.blocks_deduped": stats.blocksDeduped, "tl.kv.payload_bytes": stats.payloadBytes });
    endSpan(span);
    ctx.onTransfer?.({ stats, code: null, ms: performance.now() - started, target });
    return stats;
  } catch (e) {
    const code = e instanceof TransferError ? e.code : Code.Internal;
    endSpan(span, e);
    ctx.onTransfer?.({ stats: null, code, ms: performance.now() - started, target });
    // D may have accepted the push and only its ack was lost (a connection cut after D
    // answered): nobody would claim that handle, so give it back now rather than at its
    // time to live. ALREADY_EXISTS names a push that is not ours.
    if (code !== Code.AlreadyExists) releaseUnclaimed(ctx.transport, target, handleId);
    throw new HandoffError(
      "decode",
      code,
      `kv transfer to ${target} failed: ${e instanceof ConnectError ? e.rawMessage : e instanceof Error ? e.message : String(e)}`,
    );
  }
}
