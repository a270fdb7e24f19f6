import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { Code, httpStatusOf } from "../rpc/status.ts";
import { KV_FORMAT, promptHashes } from "../codec/index.ts";
import { samplingToProto } from "../control/index.ts";
import { grpcClient, serveGrpc, type GrpcServer } from "../rpc/index.ts";
import { Role, WorkerRegistry as WorkerRegistryService } from "../gen/tl/control/v1/control_pb.ts";
import { EngineControl, PrefillRequestSchema, type KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import {
  CHOICES_HEADER,
  completionResponse,
  DRAWS_HEADER,
  errorResponse,
  FIRST_TOKEN_HEADER,
  HANDLE_HEADER,
  HttpError,
  parseCompletion,
  requestId,
  samplingOf,
  serveHttp,
  TokenQueue,
  type CompletionKind,
  type CompletionParams,
  type HttpServer,
} from "../http/index.ts";
import { type ChatRenderer, type Tokenizer, tokenizerFingerprint } from "../model/index.ts";
import type { TokenLogprobs } from "../rng/index.ts";
import {
  createMetrics,
  endSpan,
  extractHeaders,
  log,
  metricsResponse,
  SpanKind,
  startSpan,
  traceHeaders,
  type Attributes,
  type Metrics,
  type Span,
} from "../obs/index.ts";
import { failedSideOf, releaseUnclaimed } from "../handoff/index.ts";
import { RoutingTransport } from "../transfer/index.ts";
import { RegistryService } from "./registry-service.ts";
import { KvAffinity, pickByLoad, pickDecode } from "./router.ts";
import { WorkerRegistry, type WorkerView } from "./worker-registry.ts";
import { readTokenStream } from "./token-stream.ts";

export interface GatewayOptions {
  host?: string;
  httpPort?: number;
  registryPort?: number;
  tokenizer: Tokenizer;
  /** The model's chat template, as the engines render it (prompt hashes must match theirs). */
  chat?: ChatRenderer;
  modelName: string;
  maxModelLen: number;
  /** Beat interval told to engines; a worker is evicted after 3 silent intervals. */
  heartbeatIntervalMs?: number;
  prefillTimeoutMs?: number;
}

export interface Gateway {
  readonly httpAddress: string;
  readonly registryAddress: string;
  readonly registry: WorkerRegistry;
  readonly metrics: Metrics;
  /** Refuses new requests (503) and waits for in-flight ones up to the deadline; resolves with those left. */
  drain(deadlineMs: number): Promise<number>;
  stop(): Promise<void>;
}

/** How one request was served, as reported in headers, the last chunk and /metrics. */
interface Served {
  served: "disaggregated" | "disaggregated-retried" | "colocated-fallback";
  prefillWorker: string;
  decodeWorker: string;
  blocksSent: number;
  blocksDeduped: number;
  payloadBytes: number;
}

const NEVER = new AbortController().signal;

/** One routed prompt: its choices' token streams and how they were served. */
interface Routed {
  qs: TokenQueue[];
  served: Served;
}

/** Prompt k of a request as a request of its own (its n choices use seed + j, as vLLM). */
function promptParams(p: CompletionParams, k: number): CompletionParams {
  if (p.prompts.length === 1) return p;
  const prompt = p.prompts[k]!;
  return { ...p, promptTokens: prompt, prompts: [prompt] };
}

/** `p`, or a rejection as soon as `signal` aborts (p itself goes on). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

const RETRYABLE = new Set([Code.DataLoss, Code.Unavailable, Code.DeadlineExceeded]);

// Span attributes that never change, built once so tracing off allocates nothing per request.
const SERVER_ATTRS: Record<CompletionKind, Attributes> = {
  completion: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" },
  chat: { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/chat/completions" },
};
const PREFILL_ATTRS: Attributes = { "tl.role": "gateway", "rpc.system": "grpc", "rpc.service": "tl.engine.v1.EngineControl", "rpc.method": "Prefill" };
const RESUME_ATTRS: Attributes = { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" };

/** Each choice's first token as P sampled it, with its logprobs when the request asked for them. */
function firstTokens(h: KvHandle): { token: number; logprobs?: TokenLogprobs; finished: boolean }[] {
  const top = h.firstTopLogprobs.map((t): [number, number] => [t.token, t.logprob]);
  const lp = (logprob: number | undefined) => (logprob === undefined ? undefined : { logprob, top });
  if (h.choiceFirstTokens.length === 0) return [{ token: h.firstToken, logprobs: lp(h.firstTokenLogprob), finished: h.finished }];
  return h.choiceFirstTokens.map((token, j) => ({ token, logprobs: lp(h.choiceFirstLogprobs[j]), finished: h.choiceFinished[j] ?? false }));
}

/** The front door: registry for heartbeats, OpenAI HTTP for clients, routing in between. */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const host = opts.host ?? "127.0.0.1";
  const registry = new WorkerRegistry({ intervalMs: opts.heartbeatIntervalMs ?? 2000 });
  const registryService = new RegistryService(registry, {
    expect: { model: opts.modelName, vocabSize: opts.tokenizer.vocabSize, tokenizerFingerprint: tokenizerFingerprint(opts.tokenizer) },
  });
  const metrics = createMetrics();
  const affinity = new KvAffinity();
  const inflight = new Map<string, number>();
  const grpc: GrpcServer = await serveGrpc((r) => r.service(WorkerRegistryService, registryService.impl), { host, port: opts.registryPort ?? 0 });
  const limits = { tokenizer: opts.tokenizer, maxModelLen: opts.maxModelLen, chat: opts.chat };
  const prefillTimeoutMs = opts.prefillTimeoutMs ?? 60_000;

  // Release only: pushes are the prefill engines' business.
  const releaser = new RoutingTransport({ dataPlane: false, timeoutMs: 5000 });
  const busy = (id: string, d: number) => inflight.set(id, (inflight.get(id) ?? 0) + d);

  async function prefill(p: WorkerView, d: WorkerView, params: CompletionParams, id: string, signal: AbortSignal, parent: Span): Promise<KvHandle> {
    const control = grpcClient(EngineControl, p.status.grpcAddress, { timeoutMs: prefillTimeoutMs });
    const span = startSpan("tl.engine.v1.EngineControl/Prefill", SpanKind.CLIENT, parent, PREFILL_ATTRS);
    if (span.isRecording())
      span.setAttributes({ "server.address": p.status.grpcAddress, "tl.worker_id": p.status.workerId, "tl.decode_target": d.status.kvAddress });
    try {
      const handle = await control.prefill(
        create(PrefillRequestSchema, {
          requestId: id,
          promptTokens: params.promptTokens,
          sampling: samplingToProto(samplingOf(params)),
          decodeTarget: d.status.kvAddress,
          kvFormat: KV_FORMAT,
          n: params.n,
        }),
        { signal, headers: traceHeaders(span) },
      );
      if (span.isRecording())
        span.setAttributes({
          "tl.kv.blocks_sent": handle.blocksSent,
          "tl.kv.blocks_deduped": handle.blocksDeduped,
          "tl.kv.payload_bytes": Number(handle.payloadBytes),
        });
      endSpan(span);
      return handle;
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  /** The completions body D (or a colocated engine) continues `n` choices of `params` with. */
  function resumeBody(params: CompletionParams, tokens: readonly number[], n: number) {
    return {
      prompt: tokens,
      n,
      stop: params.stop,
      include_stop_str_in_output: params.includeStopStr,
      max_tokens: params.maxTokens,
      temperature: params.temperature,
      top_p: params.topP,
      top_k: params.topK,
      seed: params.seed.toString(),
      stop_token_ids: params.stopTokenIds,
      presence_penalty: params.presencePenalty,
      frequency_penalty: params.frequencyPenalty,
      repetition_penalty: params.repetitionPenalty,
      logit_bias: Object.fromEntries(params.logitBias),
      min_tokens: params.minTokens,
      ignore_eos: params.ignoreEos,
      logprobs: params.topLogprobs,
      stream: true,
      return_token_ids: true,
    };
  }

  /** The request's SERVER span runs until its last token (respond) or its failure here. */
  async function complete(req: Request, kind: CompletionKind): Promise<Response> {
    const span = startSpan(
      kind === "chat" ? "POST /v1/chat/completions" : "POST /v1/completions",
      SpanKind.SERVER,
      extractHeaders(req.headers),
      SERVER_ATTRS[kind],
    );
    try {
      return await route(req, kind, span);
    } catch (e) {
      endSpan(span, e);
      throw e;
    }
  }

  async function route(req: Request, kind: CompletionKind, span: Span): Promise<Response> {
    const arrived = performance.now();
    let body: unknown;
    try {
      body = await req.json();
    } catch (e) {
      throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
    }
    const params = parseCompletion(kind, body, limits);
    if (params.model !== undefined && params.model !== opts.modelName) {
      throw new HttpError(
        404,
        `model ${JSON.stringify(params.model)} is not served; this gateway serves ${JSON.stringify(opts.modelName)}`,
        "invalid_request_error",
        "model",
      );
    }
    const id = req.headers.get("x-request-id") ?? requestId(kind === "chat" ? "chatcmpl" : "cmpl");
    if (span.isRecording()) span.setAttribute("tl.request_id", id);
    // A list of prompts: each prompt is routed as a request of its own, with its own
    // abort. Its n choices share one prefill and one resume (one D stream carrying them
    // all); a stop string then ends its choice on D itself (stop is forwarded), so only a
    // single-choice stream is cut from here.
    const aborts = params.prompts.map(() => new AbortController());
    req.signal.addEventListener("abort", () => aborts.forEach((a) => a.abort()));
    const routed = await Promise.all(
      aborts.map((a, k) =>
        routePrompt(promptParams(params, k), params.prompts.length === 1 ? id : `${id}-${k}`, arrived, a, span).catch((e: unknown) => {
          aborts.forEach((x) => x.abort());
          throw e;
        }),
      ),
    );
    const onStop = (i: number) => {
      if (params.n === 1) aborts[i]!.abort();
    };
    return respond(
      routed.flatMap((r) => r.qs),
      params,
      id,
      routed[0]!.served,
      arrived,
      onStop,
      () => aborts.forEach((a) => a.abort()),
      span,
    );
  }

  /** Routes one prompt's n choices: a prefill/decode pair (retried on another pair when nothing reached the client), else a colocated engine. */
  async function routePrompt(params: CompletionParams, id: string, arrived: number, abort: AbortController, span: Span): Promise<Routed> {
    const exclude = new Set<string>();
    let retried = false;
    for (let attempt = 0; attempt < 4; attempt++) {
      const workers = registry.live();
      const P = pickByLoad(workers, Role.PREFILL, inflight, exclude);
      const D = P ? pickDecode(workers, promptHashes(params.promptTokens, P.worker.status.blockTokens), affinity, inflight, exclude) : null;
      if (!P || !D) return colocated(params, id, exclude, abort, span);
      log.debug("route", { request_id: id, prefill: P.worker.status.workerId, prefill_why: P.why, decode: D.worker.status.workerId, decode_why: D.why });
      const pid = P.worker.status.workerId;
      const did = D.worker.status.workerId;
      let handle: KvHandle;
      busy(pid, 1);
      // Not cancelled along with the client: a Prefill cut short on our side can still
      // finish on P and leave its handle pending on D with nobody to release it. When the
      // client goes away, Cancel stops P's work instead and any handle the call still
      // yields is given back (abandonPrefill).
      const call = prefill(P.worker, D.worker, params, id, NEVER, span);
      try {
        handle = await untilAborted(call, abort.signal);
      } catch (e) {
        if (abort.signal.aborted) {
          abandonPrefill(call, P.worker, D.worker, id);
          throw new HttpError(499, "client closed the request");
        }
        const err = ConnectError.from(e);
        // P says which side failed: a push D did not take is D's doing, anything else P's.
        const blame = failedSideOf(err.metadata) === "decode" ? did : pid;
        metrics.transferFailures.inc({ code: Code[err.code] ?? String(err.code) });
        if (RETRYABLE.has(err.code) && !retried) {
          retried = true;
          exclude.add(blame);
          log.warn("prefill failed; retrying on another pair", { request_id: id, worker: blame, code: Code[err.code], error: err.rawMessage });
          continue;
        }
        // A decode engine out of blocks is a fact about that engine: another may have room.
        if (err.code === Code.ResourceExhausted && blame === did) {
          retried = true;
          exclude.add(did);
          log.warn("decode engine has no room; routing elsewhere", { request_id: id, worker: did, error: err.rawMessage });
          continue;
        }
        if (err.code === Code.FailedPrecondition) {
          exclude.add(blame);
          log.warn("worker refused the request; routing elsewhere", { request_id: id, worker: blame, error: err.rawMessage });
          continue;
        }
        throw new HttpError(
          httpStatusOf(err.code),
          `prefill on ${pid} failed: ${err.rawMessage}`,
          err.code === Code.InvalidArgument ? "invalid_request_error" : "server_error",
        );
      } finally {
        busy(pid, -1);
      }
      const ttft = (performance.now() - arrived) / 1000;
      const served: Served = {
        served: retried ? "disaggregated-retried" : "disaggregated",
        prefillWorker: pid,
        decodeWorker: did,
        blocksSent: handle.blocksSent,
        blocksDeduped: handle.blocksDeduped,
        payloadBytes: Number(handle.payloadBytes),
      };
      metrics.blocksSent.inc(served.blocksSent);
      metrics.blocksDeduped.inc(served.blocksDeduped);
      metrics.kvBytes.inc(served.payloadBytes);
      metrics.ttft.observe({ served: served.served }, ttft);
      if (!handle.finished) affinity.record(did, handle.blockHashes);
      log.debug("prefilled", {
        request_id: id,
        handle: handle.handleId,
        blocks_sent: served.blocksSent,
        blocks_deduped: served.blocksDeduped,
        payload_bytes: served.payloadBytes,
      });

      return { qs: resumeOnDecode(handle, params, D.worker, id, abort, span), served };
    }
    throw new HttpError(503, "no worker could take the request after retries", "server_error", null, { "retry-after": "1" });
  }

  /**
   * The choices' queues after Prefill: each starts with the first token P sampled; a
   * choice it ended is closed at once, the others continue in one resume on D.
   */
  function resumeOnDecode(handle: KvHandle, params: CompletionParams, d: WorkerView, id: string, abort: AbortController, span: Span): TokenQueue[] {
    const first = firstTokens(handle);
    const qs = first.map((c) => {
      const q = new TokenQueue();
      q.push(c.token, c.logprobs);
      return q;
    });
    const open = first.flatMap((c, j) => (c.finished ? [] : [j]));
    for (const [j, c] of first.entries()) {
      if (!c.finished) continue;
      const stop = (!params.ignoreEos && opts.tokenizer.eosIds.includes(c.token)) || params.stopTokenIds.includes(c.token);
      qs[j]!.close({ reason: stop ? "stop" : "length" });
    }
    if (open.length === 0) return qs;
    const did = d.status.workerId;
    let claimed = false;
    busy(did, 1);
    const resume = startSpan("resume", SpanKind.CLIENT, span, RESUME_ATTRS);
    if (resume.isRecording()) resume.setAttributes({ "server.address": d.status.httpAddress, "tl.worker_id": did, "tl.kv.handle": handle.handleId });
    const resumed = open.map((j) => qs[j]!);
    readTokenStream(
      `http://${d.status.httpAddress}/v1/completions`,
      resumeBody(params, handle.promptTokens, open.length),
      {
        [HANDLE_HEADER]: handle.handleId,
        [FIRST_TOKEN_HEADER]: open.map((j) => first[j]!.token).join(","),
        ...(params.n > 1 ? { [CHOICES_HEADER]: open.join(",") } : {}),
        [DRAWS_HEADER]: String(handle.rngDrawsConsumed),
        "x-request-id": id,
        ...traceHeaders(resume),
      },
      resumed,
      abort.signal,
      () => (claimed = true),
    ).finally(() => {
      const failed = resumed.find((q) => q.end.reason === "error");
      endSpan(resume, failed?.end.error);
      busy(did, -1);
      // Before D answered, the handle is still pending there: give it back.
      if (!claimed) releaseOn(d, handle.handleId, id);
    });
    return qs;
  }

  /** The client left during Prefill: stop P's work, and release on D whatever handle the call still yields. */
  function abandonPrefill(call: Promise<KvHandle>, p: WorkerView, d: WorkerView, id: string): void {
    grpcClient(EngineControl, p.status.grpcAddress, { timeoutMs: 5000 })
      .cancel({ requestId: id })
      .catch(() => {});
    call.then(
      (h) => {
        if (!h.finished) releaseOn(d, h.handleId, id);
      },
      () => {},
    );
  }

  /** Best effort: a handle nobody will claim goes back now rather than at its TTL. */
  function releaseOn(d: WorkerView, handleId: string, requestId: string): void {
    releaseUnclaimed(releaser, d.status.kvAddress, handleId, (e) => log.warn("release failed", { request_id: requestId, handle: handleId, error: String(e) }));
  }

  /** No prefill/decode pair: a `both` engine does the whole request. */
  function colocated(params: CompletionParams, id: string, exclude: Set<string>, abort: AbortController, span: Span): Routed {
    const W = pickByLoad(registry.live(), Role.BOTH, inflight, exclude);
    if (!W) {
      throw new HttpError(503, "no engine is available: no prefill/decode pair and no colocated engine", "server_error", null, { "retry-after": "2" });
    }
    const wid = W.worker.status.workerId;
    log.debug("route", { request_id: id, colocated: wid, why: `no prefill/decode pair; ${W.why}` });
    const served: Served = { served: "colocated-fallback", prefillWorker: wid, decodeWorker: wid, blocksSent: 0, blocksDeduped: 0, payloadBytes: 0 };
    const qs = Array.from({ length: params.n }, () => new TokenQueue());
    busy(wid, 1);
    const call = startSpan("colocated", SpanKind.CLIENT, span, RESUME_ATTRS);
    if (call.isRecording()) call.setAttributes({ "server.address": W.worker.status.httpAddress, "tl.worker_id": wid });
    readTokenStream(
      `http://${W.worker.status.httpAddress}/v1/completions`,
      resumeBody(params, params.promptTokens, params.n),
      { "x-request-id": id, ...traceHeaders(call) },
      qs,
      abort.signal,
      () => {},
    ).finally(() => {
      endSpan(call, qs[0]!.end.reason === "error" ? qs[0]!.end.error : undefined);
      busy(wid, -1);
    });
    return { qs, served };
  }

  function respond(
    queues: TokenQueue[],
    params: CompletionParams,
    id: string,
    s: Served,
    arrived: number,
    onStop: (choice: number) => void,
    onAbort: () => void,
    span: Span,
  ): Response | Promise<Response> {
    let n = 0;
    let firstAt = 0;
    const relay = async (q: TokenQueue, counted: TokenQueue) => {
      let i = 0;
      for await (const t of q) {
        if (n++ === 0) {
          firstAt = performance.now();
          if (s.served === "colocated-fallback") metrics.ttft.observe({ served: s.served }, (firstAt - arrived) / 1000);
        }
        counted.push(t, q.logprobsAt(i++));
      }
      counted.close(q.end);
    };
    const counted = queues.map(() => new TokenQueue());
    (async () => {
      await Promise.all(queues.map((q, i) => relay(q, counted[i]!)));
      active--;
      const end = queues.find((q) => q.end.reason === "error")?.end ?? queues.find((q) => q.end.reason === "cancelled")?.end ?? queues[0]!.end;
      const outcome = end.reason === "error" ? "error" : end.reason === "cancelled" ? "cancelled" : "ok";
      metrics.requests.inc({ served: s.served, outcome });
      if (n > queues.length) metrics.tpot.observe({ served: s.served }, (performance.now() - firstAt) / 1000 / (n - queues.length));
      log.info("request", {
        request_id: id,
        served: s.served,
        prefill_worker: s.prefillWorker,
        decode_worker: s.decodeWorker,
        prompt_tokens: params.promptTokens.length,
        output_tokens: n,
        choices: queues.length,
        outcome,
        error: end.error,
        duration_ms: Math.round(performance.now() - arrived),
        blocks_sent: s.blocksSent,
        blocks_deduped: s.blocksDeduped,
        payload_bytes: s.payloadBytes,
      });
      if (span.isRecording())
        span.setAttributes({
          "tl.served": s.served,
          "tl.prefill_worker": s.prefillWorker,
          "tl.decode_worker": s.decodeWorker,
          "tl.output_tokens": n,
          "tl.outcome": outcome,
        });
      endSpan(span, end.reason === "error" ? end.error : undefined);
    })();
    return completionResponse(counted, {
      id,
      model: opts.modelName,
      tokenizer: opts.tokenizer,
      params,
      onStop,
      onAbort,
      headers: {
        ...(params.ignoredFields.length > 0 ? { "x-tl-ignored-fields": params.ignoredFields.join(",") } : {}),
        "x-request-id": id,
        "x-tl-served": s.served,
        "x-tl-prefill-worker": s.prefillWorker,
        "x-tl-decode-worker": s.decodeWorker,
        "x-tl-blocks-sent": String(s.blocksSent),
        "x-tl-blocks-deduped": String(s.blocksDeduped),
        "x-tl-payload-bytes": String(s.payloadBytes),
        "x-tl-seed": params.seed.toString(),
      },
      extra: () => ({
        tl: {
          served: s.served,
          prefill_worker: s.prefillWorker,
          decode_worker: s.decodeWorker,
          blocks_sent: s.blocksSent,
          blocks_deduped: s.blocksDeduped,
          payload_bytes: s.payloadBytes,
        },
      }),
    });
  }

  let draining = false;
  let active = 0;
  const handler = async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    try {
      const kind = req.method !== "POST" ? null : url.pathname === "/v1/completions" ? "completion" : url.pathname === "/v1/chat/completions" ? "chat" : null;
      if (kind) {
        if (draining) throw new HttpError(503, "gateway is draining", "server_error", null, { "retry-after": "1" });
        // Counted until respond() has streamed the last token, or until complete() fails.
        active++;
        try {
          return await complete(req, kind);
        } catch (e) {
          active--;
          throw e;
        }
      }
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return Response.json({
          object: "list",
          data: [{ id: opts.modelName, object: "model", created: 0, owned_by: "tl-engine", max_model_len: opts.maxModelLen }],
        });
      }
      if (req.method === "GET" && url.pathname === "/health") {
        const live = registry.live();
        const count = (r: Role) => live.filter((w) => w.status.role === r).length;
        return Response.json({ status: "ok", workers: { prefill: count(Role.PREFILL), decode: count(Role.DECODE), both: count(Role.BOTH) } });
      }
      if (req.method === "GET" && url.pathname === "/metrics") {
        const live = registry.live();
        for (const [name, r] of [
          ["prefill", Role.PREFILL],
          ["decode", Role.DECODE],
          ["both", Role.BOTH],
        ] as const) {
          metrics.registryWorkers.set({ role: name }, live.filter((w) => w.status.role === r).length);
        }
        return metricsResponse(metrics);
      }
      throw new HttpError(404, `no route for ${req.method} ${url.pathname}`, "not_found_error");
    } catch (e) {
      return errorResponse(e);
    }
  };
  const http: HttpServer = serveHttp(handler, { host, port: opts.httpPort ?? 0 });

  return {
    httpAddress: http.address,
    registryAddress: grpc.address,
    registry,
    metrics,
    async drain(deadlineMs: number) {
      draining = true;
      const end = Date.now() + deadlineMs;
      while (active > 0 && Date.now() < end) await Bun.sleep(10);
      return active;
    },
    async stop() {
      registryService.close();
      await http.stop();
      await grpc.close();
      await releaser.close();
    },
  };
}
