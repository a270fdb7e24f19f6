import { StreamDecoder, type Tokenizer } from "../model/index.ts";
import type { CompletionParams } from "./completion-request.ts";
import { errorResponse, HttpError } from "./errors.ts";
import type { TokenQueue } from "./token-queue.ts";

/**
 * Token ids in, text out, with stop strings applied: text that could still turn into
 * a stop string is held back until it cannot, so a stream never shows part of one.
 */
export class TextAssembler {
  private readonly decoder: StreamDecoder;
  private readonly silent: Set<number>;
  private pending = "";
  private readonly holdBack: number;
  stopped = false;

  constructor(
    tokenizer: Tokenizer,
    private readonly stop: readonly string[],
    stopTokenIds: readonly number[],
    /** The prompt's last token: some tokenizers render a piece differently after BOS. */
    prevToken = -1,
  ) {
    this.decoder = new StreamDecoder(tokenizer, prevToken);
    this.silent = new Set([...tokenizer.eosIds, tokenizer.bos, ...stopTokenIds]);
    this.holdBack = Math.max(0, ...stop.map((s) => s.length - 1));
  }

  /** The text safe to emit after this token. */
  push(token: number): string {
    if (this.stopped) return "";
    if (!this.silent.has(token)) this.pending += this.decoder.push(token);
    return this.release(false);
  }

  /** Whatever is left at the end of the stream. */
  flush(): string {
    if (this.stopped) return "";
    this.pending += this.decoder.flush();
    return this.release(true);
  }

  private release(final: boolean): string {
    let cut = -1;
    for (const s of this.stop) {
      const i = this.pending.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.stopped = true;
      const out = this.pending.slice(0, cut);
      this.pending = "";
      return out;
    }
    const keep = final ? 0 : Math.min(this.holdBack, this.pending.length);
    const out = this.pending.slice(0, this.pending.length - keep);
    this.pending = this.pending.slice(this.pending.length - keep);
    return out;
  }
}

export interface ResponseContext {
  id: string;
  model: string;
  tokenizer: Tokenizer;
  params: CompletionParams;
  /** A stop string ended the text: the producer should stop. */
  onStop: () => void;
  /** The client went away before the end. */
  onAbort: () => void;
  headers?: Record<string, string>;
  /** Extra fields for the final JSON body or last chunk (how the request was served). */
  extra?: () => Record<string, unknown>;
}

function finishReason(q: TokenQueue, stopped: boolean): "stop" | "length" {
  return stopped || q.end.reason === "stop" || q.end.reason === "cancelled" ? "stop" : "length";
}

/** Answers an OpenAI request from a token queue, as SSE or as one JSON body. */
export function completionResponse(q: TokenQueue, ctx: ResponseContext): Promise<Response> | Response {
  return ctx.params.stream ? streamResponse(q, ctx) : jsonResponse(q, ctx);
}

async function jsonResponse(q: TokenQueue, ctx: ResponseContext): Promise<Response> {
  const p = ctx.params;
  const text = new TextAssembler(ctx.tokenizer, p.stop, p.stopTokenIds, p.promptTokens.at(-1));
  const ids: number[] = [];
  let out = "";
  for await (const t of q) {
    ids.push(t);
    out += text.push(t);
    if (text.stopped) {
      ctx.onStop();
      break;
    }
  }
  if (!text.stopped && q.end.reason === "error") {
    return errorResponse(new HttpError(502, `generation failed: ${q.end.error ?? "unknown error"}`, "server_error"));
  }
  out += text.flush();
  const created = Math.floor(Date.now() / 1000);
  const finish = finishReason(q, text.stopped);
  const choice =
    p.kind === "chat"
      ? { index: 0, message: { role: "assistant", content: out }, logprobs: null, finish_reason: finish }
      : { index: 0, text: out, logprobs: null, finish_reason: finish };
  return Response.json(
    {
      id: ctx.id,
      object: p.kind === "chat" ? "chat.completion" : "text_completion",
      created,
      model: ctx.model,
      choices: [p.returnTokenIds ? { ...choice, token_ids: ids } : choice],
      usage: usage(p, ids.length),
      ...ctx.extra?.(),
    },
    { headers: ctx.headers },
  );
}

function usage(p: CompletionParams, completion: number) {
  return { prompt_tokens: p.promptTokens.length, completion_tokens: completion, total_tokens: p.promptTokens.length + completion };
}

function streamResponse(q: TokenQueue, ctx: ResponseContext): Response {
  const p = ctx.params;
  const enc = new TextEncoder();
  const created = Math.floor(Date.now() / 1000);
  const object = p.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const chunk = (text: string | null, finish: string | null, ids: number[] | null, first = false) => {
    const choice: Record<string, unknown> =
      p.kind === "chat"
        ? { index: 0, delta: finish !== null && text === null ? {} : first ? { role: "assistant", content: text ?? "" } : { content: text }, logprobs: null, finish_reason: finish }
        : { index: 0, text: text ?? "", logprobs: null, finish_reason: finish };
    if (ids) choice.token_ids = ids;
    return { id: ctx.id, object, created, model: ctx.model, choices: [choice] };
  };
  let done = false;
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      const send = (obj: unknown) => controller.enqueue(enc.encode(`data: ${JSON.stringify(obj)}\n\n`));
      const text = new TextAssembler(ctx.tokenizer, p.stop, p.stopTokenIds, p.promptTokens.at(-1));
      let n = 0;
      let first = true;
      try {
        if (p.kind === "chat") {
          send(chunk("", null, p.returnTokenIds ? [] : null, true));
          first = false;
        }
        for await (const t of q) {
          n++;
          const delta = text.push(t);
          if (delta.length > 0 || p.returnTokenIds) send(chunk(delta, null, p.returnTokenIds ? [t] : null, first));
          first = false;
          if (text.stopped) {
            ctx.onStop();
            break;
          }
        }
        if (!text.stopped && q.end.reason === "error") {
          // Never a silent truncation: the client sees the stream fail.
          send({ error: { message: `generation failed: ${q.end.error ?? "unknown error"}`, type: "server_error", code: 502 } });
          done = true;
          controller.close();
          return;
        }
        const rest = text.flush();
        if (rest.length > 0) send(chunk(rest, null, p.returnTokenIds ? [] : null));
        const last = chunk(null, finishReason(q, text.stopped), null);
        send({ ...last, ...ctx.extra?.() });
        if (p.includeUsage) send({ id: ctx.id, object, created, model: ctx.model, choices: [], usage: usage(p, n) });
        controller.enqueue(enc.encode("data: [DONE]\n\n"));
        done = true;
        controller.close();
      } catch {
        // The client went away while we were writing.
        if (!done) ctx.onAbort();
      }
    },
    cancel() {
      if (!done) ctx.onAbort();
    },
  });
  return new Response(body, {
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache", ...ctx.headers },
  });
}
