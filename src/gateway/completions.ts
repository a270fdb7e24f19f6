import { constraintHash } from "../grammar/index.ts";
import { ConnectError } from "@connectrpc/connect";
import type { ToolParserName } from "../http/index.ts";
import type { KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import {
  clientRequestId,
  type CompletionKind,
  type CompletionParams,
  completionResponse,
  HttpError,
  parseCompletion,
  requestId,
  type TokenQueue,
} from "../http/index.ts";
import type { ChatRenderer, Tokenizer } from "../tokenizer/index.ts";
import { type Attributes, endSpan, extractHeaders, log, type Metrics, type Span, SpanKind, startSpan } from "../obs/index.ts";
import { Code, codeName, httpStatusOf } from "../rpc/status.ts";
import { failedSideOf } from "../handoff/index.ts";
import type { Admission } from "./admission.ts";
import type { PendingWork } from "./pending-work.ts";
import { promptHashes, quote } from "../codec/index.ts";
import type { Pair, PairPicker } from "./pair-picker.ts";
import { RetryPolicy } from "./pair-picker.ts";
import { type PrefillClient, untilAborted } from "./prefill-client.ts";
import { followRequest, recordHandoff, type Served, servedExtra, servedHeaders } from "./request-log.ts";
import { type EngineStream, type Streaming, streamColocated, streamResume } from "./resume-stream.ts";
import type { PrefixIndex } from "./prefix-index.ts";
import type { Suspects } from "./router.ts";
import type { StreamDeadlines } from "./token-stream.ts";

const NEVER = new AbortController().signal;

// Span attributes that never change, built once so tracing off allocates nothing per request.
const SERVER_ATTRS: Record<CompletionKind, Attributes> = {
  completion: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" },
  chat: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/chat/completions" },
};

export interface CompletionsContext {
  tokenizer: Tokenizer;
  /** The model's chat template, as the engines render it (prompt hashes must match theirs). */
  chat?: ChatRenderer | undefined;
  toolParser?: ToolParserName | null;
  modelName: string;
  maxModelLen: number;
  picker: PairPicker;
  prefill: PrefillClient;
  affinity: PrefixIndex;
  /** Engines that missed a deadline, scored out by the picker for a while. */
  suspects: Suspects;
  /** An engine's stream: its first byte and the gaps between tokens. */
  deadlines: Omit<StreamDeadlines, "onMissed">;
  /**
   * Conditional disaggregation: a prompt with fewer uncached tokens than this on the
   * chosen decode engine is prefilled there (served "decode-local"); 0: always disaggregate.
   */
  disaggMinUncachedTokens: number;
  metrics: Metrics;
  admission: Admission;
  /** Gives an unclaimed handle back to its decode engine (releaseUnclaimed). */
  release: (kvAddress: string, handleId: string, requestId: string) => void;
  /** What the gateway still owes engines after a client left (an abandoned Prefill's handle): stop() settles it. */
  pending: PendingWork;
  /** Sent with every request to an engine's HTTP port (its API key). */
  engineHeaders?: Record<string, string>;
  /** Name the workers that served a request to its client (debugging only). */
  routingHeaders?: boolean;
  /** This replica's id: with routingHeaders, told in x-tl-gateway (which replica served). */
  gatewayId?: string;
}

/** One prompt on its way through the gateway: parsed, named, traced, abortable by its client. */
interface Trip {
  params: CompletionParams;
  /** Minted here, unique: what engines, logs and Cancel know the request by. */
  requestId: string;
  /** The client's x-request-id, kept for its logs, traces and the response header. */
  clientRequestId: string | undefined;
  arrived: number;
  abort: AbortController;
  span: Span;
}

/** One routed prompt: its choices' token streams, the engine's answer and how they were served. */
interface Routed extends Streaming {
  served: Served;
}

/** Prompt k of a request as a request of its own (its n choices use seed + j, as vLLM). */
function promptParams(p: CompletionParams, k: number): CompletionParams {
  if (p.prompts.length === 1) return p;
  const prompt = p.prompts[k]!;
  return { ...p, promptTokens: prompt, prompts: [prompt] };
}

/**
 * The gateway's completions: pick a pair, Prefill on P (pushing to D), emit token 1 at
 * once and stream the rest from D; retries per RetryPolicy; no pair at all falls back
 * to a `both` engine. The request's SERVER span runs until its last token or its failure.
 */
export class Completions {
  constructor(private readonly ctx: CompletionsContext) {}

  async complete(req: Request, kind: CompletionKind): Promise<Response> {
    const span = startSpan(
      kind === "chat" ? "POST /v1/chat/completions" : "POST /v1/completions",
      SpanKind.SERVER,
      extractHeaders(req.headers),
      SERVER_ATTRS[kind],
    );
    try {
      return await this.routeAll(req, await this.tripOf(req, kind, span));
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  private async tripOf(req: Request, kind: CompletionKind, span: Span): Promise<Trip> {
    const arrived = performance.now();
    const clientId = clientRequestId(req);
    let body: unknown;
    try {
      body = await req.json();
    } catch (e) {
      throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
    }
    const { ctx } = this;
    const params = parseCompletion(kind, body, { tokenizer: ctx.tokenizer, maxModelLen: ctx.maxModelLen, chat: ctx.chat, toolParser: ctx.toolParser ?? null });
    if (params.model !== undefined && params.model !== ctx.modelName) {
      throw new HttpError(404, `model ${quote(params.model)} is not served; this gateway serves ${quote(ctx.modelName)}`, "invalid_request_error", "model");
    }
    const id = requestId(kind === "chat" ? "chatcmpl" : "cmpl");
    if (span.isRecording()) {
      span.setAttribute("tl.request_id", id);
      if (clientId !== undefined) span.setAttribute("tl.client_request_id", clientId);
    }
    return { params, requestId: id, clientRequestId: clientId, arrived, abort: new AbortController(), span };
  }

  /**
   * A list of prompts: each prompt is routed as a request of its own, with its own
   * abort. Its n choices share one prefill and one resume (one D stream carrying them
   * all); a stop string then ends its choice on D itself (stop is forwarded), so only a
   * single-choice stream is cut from here.
   */
  private async routeAll(req: Request, t: Trip): Promise<Response> {
    const { params } = t;
    const trips = params.prompts.map(
      (_, k): Trip => ({
        ...t,
        params: promptParams(params, k),
        requestId: params.prompts.length === 1 ? t.requestId : `${t.requestId}-${k}`,
        abort: new AbortController(),
      }),
    );
    const abortAll = () => trips.forEach((x) => x.abort.abort());
    req.signal.addEventListener("abort", abortAll);
    const routed = await Promise.all(
      trips.map((x) =>
        this.route(x).catch((e: unknown) => {
          abortAll();
          throw e;
        }),
      ),
    );
    const onStop = (i: number) => {
      if (params.n === 1) trips[i]!.abort.abort();
    };
    return this.respond(
      routed.flatMap((r) => r.qs),
      t,
      routed[0]!.served,
      onStop,
      abortAll,
    );
  }

  /**
   * Routes one prompt's n choices: on a pair (prefilled on P, or on D itself when D
   * lacks few of its tokens), else on a colocated engine. A failed Prefill routes again
   * per RetryPolicy; an engine that fails the stream before it answered (nothing has
   * reached the client yet) is left out and the prompt routed again.
   */
  private async route(t: Trip): Promise<Routed> {
    const exclude = new Set<string>();
    const policy = new RetryPolicy();
    for (let attempt = 0; attempt < RetryPolicy.MAX_ATTEMPTS; attempt++) {
      const pair = this.ctx.picker.pair(t.params.promptTokens, exclude);
      const routed = pair ? await this.onPair(pair, t, policy, exclude) : this.colocated(t, exclude, policy.wasRetried);
      if (routed === null) continue;
      const answer = await routed.answer;
      if (answer !== "failed") return routed;
      if (t.abort.signal.aborted) throw new HttpError(499, "client closed the request");
      if (!pair) return routed; // no other engine to try: the client gets the stream's error
      const did = routed.served.decodeWorker;
      this.ctx.suspects.mark(did);
      exclude.add(did);
      policy.streamFailed();
      log.warn("engine failed the stream before answering; routing again", { request_id: t.requestId, worker: did });
    }
    throw new HttpError(503, "no worker could take the request after retries", "server_error", null, { "retry-after": "1" });
  }

  /** The pair's way: decode-local when D lacks few tokens, else Prefill on P; null when the policy routes again. */
  private async onPair(pair: Pair, t: Trip, policy: RetryPolicy, exclude: Set<string>): Promise<Routed | null> {
    const uncached = this.uncachedOn(pair, t.params.promptTokens);
    if (uncached < this.ctx.disaggMinUncachedTokens) {
      pair.releasePrefill();
      return this.decodeLocal(t, pair, uncached);
    }
    const handle = await this.prefillOn(pair, t, policy, exclude);
    if (handle === null) return null;
    const want = t.params.constraint ? constraintHash(t.params.constraint) : "";
    if (handle.constraintHash !== want) {
      // P sampled the first token under another constraint (or none: a build without structured
      // outputs): nothing it started can be continued.
      pair.releaseDecode();
      this.ctx.release(pair.decode.worker.status.kvAddress, handle.handleId, t.requestId);
      log.warn("prefill engine did not apply the structured output", { request_id: t.requestId, worker: pair.prefill.worker.status.workerId });
      throw new HttpError(502, `request ${t.requestId}: the prefill engine did not apply the structured output`, "server_error");
    }
    return this.disaggregated(t, pair, handle, policy.wasRetried);
  }

  /** Prompt tokens outside the leading blocks the gateway believes D holds (the picker's hits, in D's blocks). */
  private uncachedOn(pair: Pair, tokens: readonly number[]): number {
    const pb = pair.prefill.worker.status.blockTokens;
    return Math.max(0, tokens.length - pair.decode.hits * pb);
  }

  /** Prefill on the pair: the handle, or null when the policy routes again (`exclude` grown). */
  private async prefillOn(pair: Pair, t: Trip, policy: RetryPolicy, exclude: Set<string>): Promise<KvHandle | null> {
    const { ctx } = this;
    const p = pair.prefill.worker;
    const d = pair.decode.worker;
    const pid = p.status.workerId;
    const did = d.status.workerId;
    log.debug("route", { request_id: t.requestId, prefill: pid, prefill_why: pair.prefill.why, decode: did, decode_why: pair.decode.why });
    // Not cancelled along with the client: a Prefill cut short on our side can still
    // finish on P and leave its handle pending on D with nobody to release it. When the
    // client goes away, Cancel stops P's work instead and any handle the call still
    // yields is given back.
    const call = ctx.prefill.prefill(p, d, t.params, t.requestId, NEVER, t.span);
    // D turning suspect meanwhile (another stream saw it stall) routes this prompt again at once.
    const suspect = ctx.suspects.signal(did);
    try {
      return await untilAborted(call, AbortSignal.any([t.abort.signal, suspect]));
    } catch (e) {
      pair.releaseDecode();
      if (t.abort.signal.aborted || suspect.aborted) {
        ctx.pending.track(ctx.prefill.abandon(call, p, t.requestId, (h) => ctx.release(d.status.kvAddress, h, t.requestId)));
      }
      if (t.abort.signal.aborted) throw new HttpError(499, "client closed the request");
      if (suspect.aborted) {
        exclude.add(did);
        policy.streamFailed();
        log.warn("decode engine became suspect during Prefill; routing again", { request_id: t.requestId, worker: did });
        return null;
      }
      const err = ConnectError.from(e);
      ctx.metrics.transferFailures.inc({ code: Code[err.code] ?? String(err.code) });
      const next = policy.decide(err, pid, did);
      for (const w of next.suspect) ctx.suspects.mark(w);
      if (!next.again) {
        // The client hears its request id and the kind of failure; which worker, where,
        // and the engine's own words go to the log.
        log.warn("prefill failed", { request_id: t.requestId, worker: pid, code: Code[err.code], error: err.rawMessage });
        throw prefillFailure(err, t.requestId);
      }
      if (next.exclude !== null) exclude.add(next.exclude);
      log.warn(next.why, { request_id: t.requestId, worker: next.exclude, suspect: next.suspect, code: Code[err.code], error: err.rawMessage });
      return null;
    } finally {
      pair.releasePrefill();
    }
  }

  /** Token 1 from the handle now, the rest resumed on D. */
  private disaggregated(t: Trip, pair: Pair, handle: KvHandle, retried: boolean): Routed {
    const { ctx } = this;
    const did = pair.decode.worker.status.workerId;
    const served: Served = {
      served: retried ? "disaggregated-retried" : "disaggregated",
      prefillWorker: pair.prefill.worker.status.workerId,
      decodeWorker: did,
      blocksSent: handle.blocksSent,
      blocksDeduped: handle.blocksDeduped,
      payloadBytes: Number(handle.payloadBytes),
    };
    recordHandoff(ctx.metrics, served, (performance.now() - t.arrived) / 1000);
    if (!handle.finished) ctx.affinity.record(did, handle.blockHashes);
    log.debug("prefilled", {
      request_id: t.requestId,
      handle: handle.handleId,
      blocks_sent: served.blocksSent,
      blocks_deduped: served.blocksDeduped,
      payload_bytes: served.payloadBytes,
    });
    const d = pair.decode.worker;
    // Before D answered, the handle is still pending there: give it back.
    const s = streamResume(this.streamOf(t, d, pair.releaseDecode), handle, ctx.tokenizer, (h) => ctx.release(d.status.kvAddress, h, t.requestId));
    return { ...s, served };
  }

  /** Conditional disaggregation: D lacks fewer tokens than the threshold, so it prefills them itself, no transfer. */
  private decodeLocal(t: Trip, pair: Pair, uncached: number): Routed {
    const d = pair.decode.worker;
    const did = d.status.workerId;
    log.debug("route", { request_id: t.requestId, decode_local: did, uncached_tokens: uncached, why: pair.decode.why });
    // D caches the prompt's full blocks now, as after a push.
    this.ctx.affinity.record(did, promptHashes(t.params.promptTokens, pair.prefill.worker.status.blockTokens));
    const served: Served = { served: "decode-local", prefillWorker: did, decodeWorker: did, blocksSent: 0, blocksDeduped: 0, payloadBytes: 0 };
    return { ...streamColocated(this.streamOf(t, d, pair.releaseDecode), "decode-local"), served };
  }

  /** No prefill/decode pair: a `both` engine does the whole request. */
  private colocated(t: Trip, exclude: ReadonlySet<string>, retried: boolean): Routed {
    const W = this.ctx.picker.colocated(exclude);
    if (!W) {
      throw new HttpError(503, "no engine is available: no prefill/decode pair and no colocated engine", "server_error", null, { "retry-after": "2" });
    }
    const w = W.pick.worker;
    const wid = w.status.workerId;
    log.debug("route", { request_id: t.requestId, colocated: wid, retried, why: `no prefill/decode pair; ${W.pick.why}` });
    const served: Served = { served: "colocated-fallback", prefillWorker: wid, decodeWorker: wid, blocksSent: 0, blocksDeduped: 0, payloadBytes: 0 };
    return { ...streamColocated(this.streamOf(t, w, W.release)), served };
  }

  private streamOf(t: Trip, worker: EngineStream["worker"], release: () => void): EngineStream {
    const { suspects, deadlines } = this.ctx;
    const onMissed = (what: string) => {
      suspects.mark(worker.status.workerId);
      log.warn("engine missed a deadline; suspect for a while", { request_id: t.requestId, worker: worker.status.workerId, missed: what });
    };
    return {
      worker,
      params: t.params,
      requestId: t.requestId,
      signal: t.abort.signal,
      parent: t.span,
      release,
      deadlines: { ...deadlines, onMissed },
      headers: this.ctx.engineHeaders ?? {},
    };
  }

  private respond(queues: TokenQueue[], t: Trip, s: Served, onStop: (choice: number) => void, onAbort: () => void): Response | Promise<Response> {
    const { ctx } = this;
    const p = t.params;
    const followed = {
      requestId: t.requestId,
      clientRequestId: t.clientRequestId,
      modelName: ctx.modelName,
      params: p,
      served: s,
      arrived: t.arrived,
      span: t.span,
    };
    const counted = followRequest(ctx.metrics, queues, followed, () => ctx.admission.leave());
    return completionResponse(counted, {
      id: t.requestId,
      model: ctx.modelName,
      tokenizer: ctx.tokenizer,
      params: p,
      onStop,
      onAbort,
      headers: {
        ...(p.ignoredFields.length > 0 ? { "x-tl-ignored-fields": p.ignoredFields.join(",") } : {}),
        "x-request-id": t.clientRequestId ?? t.requestId,
        ...servedHeaders(s, ctx.routingHeaders === true),
        ...(ctx.routingHeaders === true && ctx.gatewayId ? { "x-tl-gateway": ctx.gatewayId } : {}),
        "x-tl-seed": p.seed.toString(),
      },
      extra: () => servedExtra(s, ctx.routingHeaders === true),
    });
  }
}

/**
 * What the client hears of a Prefill that failed for good: its request id and the kind
 * of failure. Only the request's own refusal (INVALID_ARGUMENT from Prefill's checks, the
 * prefill side) says why, in Prefill's words; anything else, D's refusal of the push
 * included, whose words name D's address, is a code name (the log has the rest).
 */
export function prefillFailure(err: ConnectError, requestId: string): HttpError {
  const decode = failedSideOf(err.metadata) === "decode";
  if (err.code === Code.InvalidArgument && !decode) return new HttpError(400, `request ${requestId}: ${err.rawMessage}`);
  const status = err.code === Code.InvalidArgument ? 502 : httpStatusOf(err.code);
  return new HttpError(status, `request ${requestId}: prefill failed (${codeName(err.code)})`, "server_error");
}
