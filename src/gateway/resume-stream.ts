import type { KvHandle } from "../gen/tl/engine/v1/engine_pb.ts";
import { type CompletionParams, DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER, type TokenQueue } from "../http/index.ts";
import { type Attributes, endSpan, type Span, SpanKind, startSpan, traceHeaders } from "../obs/index.ts";
import type { InFlight } from "./pair-picker.ts";
import { readTokenStream } from "./token-stream.ts";
import type { WorkerView } from "./worker-registry.ts";

const RESUME_ATTRS: Attributes = { "tl.role": "gateway", "http.request.method": "POST", "url.path": "/v1/completions" };

/** The completion an engine is asked for: the request's sampling on `tokens`, streamed as token ids. */
function resumeBody(params: CompletionParams, tokens: readonly number[]) {
  return {
    prompt: tokens,
    max_tokens: params.maxTokens,
    temperature: params.temperature,
    top_p: params.topP,
    top_k: params.topK,
    seed: params.seed.toString(),
    stop_token_ids: params.stopTokenIds,
    stream: true,
    return_token_ids: true,
  };
}

/** One engine's token stream for a request, fed into a queue. */
export interface EngineStream {
  worker: WorkerView;
  params: CompletionParams;
  requestId: string;
  q: TokenQueue;
  signal: AbortSignal;
  parent: Span;
  inflight: InFlight;
}

/**
 * The rest of the tokens from D, resuming `handle` (X-TL-KV-Handle and friends), under
 * a "resume" CLIENT span. A handle D never claimed (it refused, or the stream failed
 * before it answered) goes to `onUnclaimed`.
 */
export function streamResume(s: EngineStream, handle: KvHandle, onUnclaimed: (handleId: string) => void): void {
  let claimed = false;
  const headers = {
    [HANDLE_HEADER]: handle.handleId,
    [FIRST_TOKEN_HEADER]: String(handle.firstToken),
    [DRAWS_HEADER]: String(handle.rngDrawsConsumed),
  };
  void stream(s, "resume", handle.promptTokens, headers, { "tl.kv.handle": handle.handleId }, () => (claimed = true)).finally(() => {
    if (!claimed) onUnclaimed(handle.handleId);
  });
}

/** The whole request on one `both` engine, under a "colocated" CLIENT span. */
export function streamColocated(s: EngineStream): void {
  void stream(s, "colocated", s.params.promptTokens, {}, {}, () => {});
}

async function stream(
  s: EngineStream,
  name: string,
  tokens: readonly number[],
  headers: Record<string, string>,
  attrs: Attributes,
  onAccepted: () => void,
): Promise<void> {
  const w = s.worker.status;
  s.inflight.add(w.workerId, 1);
  const span = startSpan(name, SpanKind.CLIENT, s.parent, RESUME_ATTRS);
  if (span.isRecording()) span.setAttributes({ "server.address": w.httpAddress, "tl.worker_id": w.workerId, ...attrs });
  try {
    await readTokenStream(
      `http://${w.httpAddress}/v1/completions`,
      resumeBody(s.params, tokens),
      { ...headers, "x-request-id": s.requestId, ...traceHeaders(span) },
      s.q,
      s.signal,
      onAccepted,
    );
  } finally {
    endSpan(span, s.q.end.reason === "error" ? s.q.end.error : undefined);
    s.inflight.add(w.workerId, -1);
  }
}
