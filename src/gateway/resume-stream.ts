import type { KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import { CHOICES_HEADER, type CompletionParams, DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER, TokenQueue } from "../http/index.ts";
import type { Tokenizer } from "../model/index.ts";
import { type Attributes, endSpan, type Span, SpanKind, startSpan, traceHeaders } from "../obs/index.ts";
import type { TokenLogprobs } from "../rng/index.ts";
import type { InFlight } from "./pair-picker.ts";
import { readTokenStream } from "./token-stream.ts";
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
  inflight: InFlight;
  /** Sent to the engine with every request (its API key). */
  headers: Record<string, string>;
}

/**
 * The choices' queues after Prefill: each starts with the first token P sampled; a
 * choice it ended is closed at once, the others continue in one resume on D
 * (X-TL-KV-Handle and friends) under a "resume" CLIENT span. A handle D never claimed
 * (it refused, or the stream failed before it answered) goes to `onUnclaimed`.
 */
export function streamResume(s: EngineStream, handle: KvHandle, tokenizer: Tokenizer, onUnclaimed: (handleId: string) => void): TokenQueue[] {
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
  if (open.length === 0) return qs;
  let claimed = false;
  const headers = {
    [HANDLE_HEADER]: handle.handleId,
    [FIRST_TOKEN_HEADER]: open.map((j) => first[j]!.token).join(","),
    ...(params.n > 1 ? { [CHOICES_HEADER]: open.join(",") } : {}),
    [DRAWS_HEADER]: String(handle.rngDrawsConsumed),
  };
  const resumed = open.map((j) => qs[j]!);
  void stream(s, "resume", handle.promptTokens, resumed, headers, { "tl.kv.handle": handle.handleId }, () => (claimed = true)).finally(() => {
    if (!claimed) onUnclaimed(handle.handleId);
  });
  return qs;
}

/** The whole prompt, its n choices, on one `both` engine, under a "colocated" CLIENT span. */
export function streamColocated(s: EngineStream): TokenQueue[] {
  const qs = Array.from({ length: s.params.n }, () => new TokenQueue());
  void stream(s, "colocated", s.params.promptTokens, qs, {}, {}, () => {});
  return qs;
}

async function stream(
  s: EngineStream,
  name: string,
  tokens: readonly number[],
  qs: TokenQueue[],
  headers: Record<string, string>,
  attrs: Attributes,
  onAccepted: () => void,
): Promise<void> {
  const w = s.worker.status;
  s.inflight.add(w.workerId, 1);
  const span = startSpan(name, SpanKind.CLIENT, s.parent, RESUME_ATTRS);
  if (span.isRecording()) span.setAttributes({ "server.address": w.httpAddress, "tl.worker_id": w.workerId, ...attrs });
  try {
    const body = resumeBody(s.params, tokens, qs.length);
    await readTokenStream(
      `http://${w.httpAddress}/v1/completions`,
      body,
      { ...s.headers, ...headers, "x-request-id": s.requestId, ...traceHeaders(span) },
      qs,
      s.signal,
      onAccepted,
    );
  } finally {
    endSpan(span, qs.find((q) => q.end.reason === "error")?.end.error);
    s.inflight.add(w.workerId, -1);
  }
}
