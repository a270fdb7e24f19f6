import { ConnectError } from "@connectrpc/connect";
import type { KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import { type CompletionKind, type CompletionParams, completionResponse, HttpError, parseCompletion, requestId, TokenQueue } from "../http/index.ts";
import type { Tokenizer } from "../model/index.ts";
import { type Attributes, endSpan, extractHeaders, log, type Metrics, type Span, SpanKind, startSpan } from "../obs/index.ts";
import { Code, httpStatusOf } from "../rpc/status.ts";
import type { Admission } from "./admission.ts";
import { type InFlight, type Pair, type PairPicker, RetryPolicy } from "./pair-picker.ts";
import { type PrefillClient, untilAborted } from "./prefill-client.ts";
import { followRequest, recordHandoff, type Served, servedExtra, servedHeaders } from "./request-log.ts";
import { type EngineStream, streamColocated, streamResume } from "./resume-stream.ts";
import type { KvAffinity } from "./router.ts";

const NEVER = new AbortController().signal;

// Span attributes that never change, built once so tracing off allocates nothing per request.
const SERVER_ATTRS: Record<CompletionKind, Attributes> = {
  completion: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" },
  chat: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/chat/completions" },
};

export interface CompletionsContext {
  tokenizer: Tokenizer;
  modelName: string;
  maxModelLen: number;
  picker: PairPicker;
  prefill: PrefillClient;
  affinity: KvAffinity;
  inflight: InFlight;
  metrics: Metrics;
  admission: Admission;
  /** Gives an unclaimed handle back to its decode engine (releaseUnclaimed). */
  release: (kvAddress: string, handleId: string, requestId: string) => void;
}

/** One request on its way through the gateway: parsed, named, traced, abortable by its client. */
interface Trip {
  params: CompletionParams;
  requestId: string;
  arrived: number;
  abort: AbortController;
  span: Span;
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
      return await this.route(await this.tripOf(req, kind, span));
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  private async tripOf(req: Request, kind: CompletionKind, span: Span): Promise<Trip> {
    const arrived = performance.now();
    let body: unknown;
    try {
      body = await req.json();
    } catch (e) {
      throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
    }
    const { ctx } = this;
    const params = parseCompletion(kind, body, { tokenizer: ctx.tokenizer, maxModelLen: ctx.maxModelLen });
    if (params.model !== undefined && params.model !== ctx.modelName) {
      throw new HttpError(
        404,
        `model ${JSON.stringify(params.model)} is not served; this gateway serves ${JSON.stringify(ctx.modelName)}`,
        "invalid_request_error",
        "model",
      );
    }
    const id = req.headers.get("x-request-id") ?? requestId(kind === "chat" ? "chatcmpl" : "cmpl");
    if (span.isRecording()) span.setAttribute("tl.request_id", id);
    const abort = new AbortController();
    req.signal.addEventListener("abort", () => abort.abort());
    return { params, requestId: id, arrived, abort, span };
  }

  private async route(t: Trip): Promise<Response> {
    const exclude = new Set<string>();
    const policy = new RetryPolicy();
    for (let attempt = 0; attempt < RetryPolicy.MAX_ATTEMPTS; attempt++) {
      const pair = this.ctx.picker.pair(t.params.promptTokens, exclude);
      if (!pair) return this.colocated(t, exclude);
      const handle = await this.prefillOn(pair, t, policy, exclude);
      if (handle !== null) return this.disaggregated(t, pair, handle, policy.wasRetried);
    }
    throw new HttpError(503, "no worker could take the request after retries", "server_error", null, { "retry-after": "1" });
  }

  /** Prefill on the pair: the handle, or null when the policy routes again (`exclude` grown). */
  private async prefillOn(pair: Pair, t: Trip, policy: RetryPolicy, exclude: Set<string>): Promise<KvHandle | null> {
    const { ctx } = this;
    const p = pair.prefill.worker;
    const d = pair.decode.worker;
    const pid = p.status.workerId;
    const did = d.status.workerId;
    log.debug("route", { request_id: t.requestId, prefill: pid, prefill_why: pair.prefill.why, decode: did, decode_why: pair.decode.why });
    ctx.inflight.add(pid, 1);
    // Not cancelled along with the client: a Prefill cut short on our side can still
    // finish on P and leave its handle pending on D with nobody to release it. When the
    // client goes away, Cancel stops P's work instead and any handle the call still
    // yields is given back.
    const call = ctx.prefill.prefill(p, d, t.params, t.requestId, NEVER, t.span);
    try {
      return await untilAborted(call, t.abort.signal);
    } catch (e) {
      if (t.abort.signal.aborted) {
        ctx.prefill.abandon(call, p, t.requestId, (h) => ctx.release(d.status.kvAddress, h, t.requestId));
        throw new HttpError(499, "client closed the request");
      }
      const err = ConnectError.from(e);
      ctx.metrics.transferFailures.inc({ code: Code[err.code] ?? String(err.code) });
      const next = policy.decide(err, pid, did);
      if (!next.again) {
        throw new HttpError(
          httpStatusOf(err.code),
          `prefill on ${pid} failed: ${err.rawMessage}`,
          err.code === Code.InvalidArgument ? "invalid_request_error" : "server_error",
        );
      }
      exclude.add(next.exclude);
      log.warn(next.why, { request_id: t.requestId, worker: next.exclude, code: Code[err.code], error: err.rawMessage });
      return null;
    } finally {
      ctx.inflight.add(pid, -1);
    }
  }

  /** Token 1 from the handle now, the rest resumed on D. */
  private disaggregated(t: Trip, pair: Pair, handle: KvHandle, retried: boolean): Response | Promise<Response> {
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
    const q = new TokenQueue();
    q.push(handle.firstToken);
    if (handle.finished) {
      const stop = handle.firstToken === ctx.tokenizer.eos || t.params.stopTokenIds.includes(handle.firstToken);
      q.close({ reason: stop ? "stop" : "length" });
    } else {
      const d = pair.decode.worker;
      // Before D answered, the handle is still pending there: give it back.
      streamResume(this.streamOf(t, d, q), handle, (h) => ctx.release(d.status.kvAddress, h, t.requestId));
    }
    return this.respond(q, t, served);
  }

  /** No prefill/decode pair: a `both` engine does the whole request. */
  private colocated(t: Trip, exclude: ReadonlySet<string>): Response | Promise<Response> {
    const W = this.ctx.picker.colocated(exclude);
    if (!W) {
      throw new HttpError(503, "no engine is available: no prefill/decode pair and no colocated engine", "server_error", null, { "retry-after": "2" });
    }
    const wid = W.worker.status.workerId;
    log.debug("route", { request_id: t.requestId, colocated: wid, why: `no prefill/decode pair; ${W.why}` });
    const served: Served = { served: "colocated-fallback", prefillWorker: wid, decodeWorker: wid, blocksSent: 0, blocksDeduped: 0, payloadBytes: 0 };
    const q = new TokenQueue();
    streamColocated(this.streamOf(t, W.worker, q));
    return this.respond(q, t, served);
  }

  private streamOf(t: Trip, worker: EngineStream["worker"], q: TokenQueue): EngineStream {
    return { worker, params: t.params, requestId: t.requestId, q, signal: t.abort.signal, parent: t.span, inflight: this.ctx.inflight };
  }

  private respond(q: TokenQueue, t: Trip, s: Served): Response | Promise<Response> {
    const { ctx } = this;
    const counted = followRequest(ctx.metrics, q, { requestId: t.requestId, params: t.params, served: s, arrived: t.arrived, span: t.span }, () =>
      ctx.admission.leave(),
    );
    return completionResponse(counted, {
      id: t.requestId,
      model: ctx.modelName,
      tokenizer: ctx.tokenizer,
      params: t.params,
      onStop: () => t.abort.abort(),
      onAbort: () => t.abort.abort(),
      headers: { "x-request-id": t.requestId, ...servedHeaders(s), "x-tl-seed": t.params.seed.toString() },
      extra: () => servedExtra(s),
    });
  }
}
