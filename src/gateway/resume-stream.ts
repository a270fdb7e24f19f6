import type { KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import {
  CHOICES_HEADER,
  type CompletionParams,
  CONSTRAINT_HEADER,
  DRAWS_HEADER,
  FIRST_TOKEN_HEADER,
  HANDLE_HEADER,
  structuredOutputsField,
  TokenQueue,
} from "../http/index.ts";
import type { Tokenizer } from "../tokenizer/index.ts";
import { type Attributes, endSpan, type Span, SpanKind, startSpan, traceHeaders } from "../obs/index.ts";
import type { TokenLogprobs } from "../rng/index.ts";
import { readTokenStream, type StreamDeadlines, type StreamOutcome } from "./token-stream.ts";
import type { WorkerView } from "./worker-registry.ts";

const RESUME_ATTRS: Attributes = { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" };

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
    // The structured output in vLLM's spelling (tools, if any, were read on this side already).
    ...(params.constraint ? { structured_outputs: structuredOutputsField(params.constraint) } : {}),
  };
}

/** Each choice's first token as P sampled it, with its logprobs when the request asked for them. */
function firstTokens(h: KvHandle): { token: number; logprobs?: TokenLogprobs; finished: boolean }[] {
  const top = h.firstTopLogprobs.map((t): [number, number] => [t.token, t.logprob]);
  const lp = (logprob: number | undefined) => (logprob === undefined ? undefined : { logprob, top });
  if (h.choiceFirstTokens.length === 0) return [{ token: h.firstToken, logprobs: lp(h.firstTokenLogprob), finished: h.finished }];
  return h.choiceFirstTokens.map((token, j) => ({ token, logprobs: lp(h.choiceFirstLogprobs[j]), finished: h.choiceFinished[j] ?? false }));
}

/** One engine's token streams for a prompt's choices, fed into queues. */
export interface EngineStream {
  worker: WorkerView;
  params: CompletionParams;
  requestId: string;
  signal: AbortSignal;
  parent: Span;
  /** Gives back the engine's reservation; runs once the stream ended (or never started). */
  release: () => void;
  deadlines?: StreamDeadlines | undefined;
  /** Sent to the engine with every request (its API key). */
  headers: Record<string, string>;
}

/**
 * The choices' queues, and the engine's answer: "accepted" as soon as it answered 200,
 * else how the stream ended before that ("refused", or "failed": broken or too slow).
 */
export interface Streaming {
  qs: TokenQueue[];
  answer: Promise<StreamOutcome>;
}

/**
 * The choices' queues after Prefill: each starts with the first token P sampled; a
 * choice it ended is closed at once, the others continue in one resume on D
 * (X-TL-KV-Handle and friends) under a "resume" CLIENT span. A handle D never claimed
 * (it refused, or the stream failed before it answered) goes to `onUnclaimed`.
 */
export function streamResume(s: EngineStream, handle: KvHandle, tokenizer: Tokenizer, onUnclaimed: (handleId: string) => void): Streaming {
  const { params } = s;
  const first = firstTokens(handle);
  const qs = first.map((c) => {
    const q = new TokenQueue();
    q.push(c.token, c.logprobs);
    return q;
  });
  const open = first.flatMap((c, j) => (c.finished ? [] : [j]));
  for (const [j, c] of first.entries()) {
    if (!c.finished) continue;
    const stop = (!params.ignoreEos && tokenizer.eosIds.includes(c.token)) || params.stopTokenIds.includes(c.token);
    qs[j]!.close({ reason: stop ? "stop" : "length" });
  }
  if (open.length === 0) {
    s.release();
    return { qs, answer: Promise.resolve("accepted") };
  }
  let claimed = false;
  const headers = {
    [HANDLE_HEADER]: handle.handleId,
    [FIRST_TOKEN_HEADER]: open.map((j) => first[j]!.token).join(","),
    ...(params.n > 1 ? { [CHOICES_HEADER]: open.join(",") } : {}),
    [DRAWS_HEADER]: String(handle.rngDrawsConsumed),
    ...(handle.constraintHash !== "" ? { [CONSTRAINT_HEADER]: handle.constraintHash } : {}),
  };
  const resumed = open.map((j) => qs[j]!);
  const answer = Promise.withResolvers<StreamOutcome>();
  void stream(s, "resume", handle.promptTokens, resumed, headers, { "tl.kv.handle": handle.handleId }, () => {
    claimed = true;
    answer.resolve("accepted");
  }).then((outcome) => {
    answer.resolve(outcome);
    if (!claimed) onUnclaimed(handle.handleId);
  });
  return { qs, answer: answer.promise };
}

/** The whole prompt, its n choices, on one engine (a `both` one, or a decode engine prefilling locally), under a CLIENT span `name`. */
export function streamColocated(s: EngineStream, name = "colocated"): Streaming {
  const qs = Array.from({ length: s.params.n }, () => new TokenQueue());
  const answer = Promise.withResolvers<StreamOutcome>();
  void stream(s, name, s.params.promptTokens, qs, {}, {}, () => answer.resolve("accepted")).then((outcome) => answer.resolve(outcome));
  return { qs, answer: answer.promise };
}

async function stream(
  s: EngineStream,
  name: string,
  tokens: readonly number[],
  qs: TokenQueue[],
  headers: Record<string, string>,
  attrs: Attributes,
  onAccepted: () => void,
): Promise<StreamOutcome> {
  const w = s.worker.status;
  const span = startSpan(name, SpanKind.CLIENT, s.parent, RESUME_ATTRS);
  if (span.isRecording()) span.setAttributes({ "server.address": w.httpAddress, "tl.worker_id": w.workerId, ...attrs });
  try {
    const body = resumeBody(s.params, tokens, qs.length);
    // readTokenStream settles every failure as an outcome; anything else thrown is a failure too.
    return await readTokenStream(
      `http://${w.httpAddress}/v1/completions`,
      body,
      { ...s.headers, ...headers, "x-request-id": s.requestId, ...traceHeaders(span) },
      qs,
      s.signal,
      onAccepted,
      s.deadlines,
    );
  } catch (e) {
    for (const q of qs) q.close({ reason: "error", error: `stream to ${w.workerId} failed: ${e instanceof Error ? e.message : String(e)}` });
    return "failed";
  } finally {
    endSpan(span, qs.find((q) => q.end.reason === "error")?.end.error);
    s.release();
  }
}
