import { StreamDecoder, type Tokenizer } from "../tokenizer/index.ts";
import type { CompletionParams } from "./completion-request.ts";
import { errorResponse, HttpError } from "./errors.ts";
import { LogprobsWriter, toWire } from "./logprobs-shape.ts";
import type { TokenQueue } from "./token-queue.ts";
import { type ParsedCall, parseToolCalls, safeContentLength, type ToolPlan } from "./tool-calls.ts";

/** OpenAI's shape of one tool call, with a fresh id. */
function toolCallOf(call: ParsedCall) {
  return {
    id: `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
    type: "function" as const,
    function: { name: call.name, arguments: call.arguments },
  };
}

/** Chat with tools to read calls from (tool_choice other than "none"): the plan, else null. */
function toolsOf(p: CompletionParams): ToolPlan | null {
  return p.kind === "chat" && p.tools !== null && p.tools.mode !== "none" ? p.tools : null;
}

/**
 * Token ids in, text out, with stop strings applied: text that could still turn into
 * a stop string is held back until it cannot, so a stream never shows part of one.
 */
export class TextAssembler {
  private readonly decoder: StreamDecoder;
  private readonly silent: Set<number>;
  private pending = "";
  private readonly holdBack: number;
  private count = 0;
  stopped = false;

  constructor(
    tokenizer: Tokenizer,
    private readonly stop: readonly string[],
    stopTokenIds: readonly number[],
    /** The prompt's last token: some tokenizers render a piece differently after BOS. */
    prevToken = -1,
    /** vLLM's include_stop_str_in_output: the stop string stays at the end of the text. */
    private readonly includeStop = false,
    /** vLLM's min_tokens: stop strings are not looked for before this many tokens. */
    private readonly minTokens = 0,
  ) {
    this.decoder = new StreamDecoder(tokenizer, prevToken);
    this.silent = new Set([...tokenizer.eosIds, tokenizer.bos, ...stopTokenIds]);
    this.holdBack = Math.max(0, ...stop.map((s) => s.length - 1));
  }

  /** The text safe to emit after this token. */
  push(token: number): string {
    if (this.stopped) return "";
    if (!this.silent.has(token)) this.pending += this.decoder.push(token);
    if (++this.count < this.minTokens) {
      // Too early to stop: the text goes out whole, so a stop string in it is never found later.
      const out = this.pending;
      this.pending = "";
      return out;
    }
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
      const hit = this.includeStop ? this.stop.find((s) => this.pending.startsWith(s, cut))! : "";
      const out = this.pending.slice(0, cut + hit.length);
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
  /** A stop string ended choice `index`'s text: its producer should stop. */
  onStop: (index: number) => void;
  /** The client went away before the end. */
  onAbort: () => void;
  headers?: Record<string, string>;
  /** Extra fields for the final JSON body or last chunk (how the request was served). */
  extra?: () => Record<string, unknown>;
  /** Tokens of each choice emitted elsewhere before this stream (a resume: the first, from P); they count toward min_tokens. */
  emittedBefore?: number;
}

function finishReason(q: TokenQueue, stopped: boolean): "stop" | "length" {
  return stopped || q.end.reason === "stop" || q.end.reason === "cancelled" ? "stop" : "length";
}

/**
 * One choice being assembled from its queue: text with stop strings applied, the ids,
 * and the logprobs in OpenAI's shape. Choice i samples prompt ⌊i / n⌋.
 */
class ChoiceState {
  readonly text: TextAssembler;
  readonly logprobs: LogprobsWriter | null;
  readonly ids: number[] = [];
  /** How many of `ids` a chunk has carried: the final chunk carries the rest, so a stream's token_ids add up to the ids. */
  reported = 0;
  /** Completions with echo: the prompt's text, sent before the first token's. */
  readonly echoed: string;
  out = "";

  constructor(
    ctx: ResponseContext,
    readonly index: number,
    readonly q: TokenQueue,
  ) {
    const p = ctx.params;
    const prompt = p.prompts[Math.floor(index / p.n)]!;
    this.echoed = p.echo ? ctx.tokenizer.decode(prompt) : "";
    this.text = new TextAssembler(ctx.tokenizer, p.stop, p.stopTokenIds, prompt.at(-1), p.includeStopStr, p.minTokens - (ctx.emittedBefore ?? 0));
    this.logprobs = !p.showLogprobs ? null : new LogprobsWriter(ctx.tokenizer, p.kind, prompt.at(-1) ?? -1, this.echoed.length);
  }

  /** Takes the next token; returns the text it releases. */
  push(t: number): string {
    const lp = this.q.logprobsAt(this.ids.length);
    this.ids.push(t);
    if (this.logprobs && lp) this.logprobs.add(t, lp);
    return this.text.push(t);
  }

  /** The sum of the sampled tokens' logprobs: how best_of ranks candidates. */
  get cumulativeLogprob(): number {
    let sum = 0;
    for (let i = 0; i < this.ids.length; i++) sum += this.q.logprobsAt(i)?.logprob ?? 0;
    return sum;
  }

  get finish(): "stop" | "length" {
    return finishReason(this.q, this.text.stopped);
  }

  /** The internal hop's exact form of the logprobs of `ids` (see logprobs-shape.ts). */
  wireLogprobs(from: number): unknown[] {
    const out: unknown[] = [];
    for (let i = from; i < this.ids.length; i++) {
      const lp = this.q.logprobsAt(i);
      if (lp) out.push(toWire(lp));
    }
    return out;
  }
}

/** Answers an OpenAI request from one token queue per choice, as SSE or as one JSON body. */
export function completionResponse(queues: TokenQueue | TokenQueue[], ctx: ResponseContext): Promise<Response> | Response {
  const qs = Array.isArray(queues) ? queues : [queues];
  const choices = qs.map((q, i) => new ChoiceState(ctx, i, q));
  return ctx.params.stream ? streamResponse(choices, ctx) : jsonResponse(choices, ctx);
}

/** Reads choice c to its end; the error message when it failed. */
async function collect(c: ChoiceState, ctx: ResponseContext): Promise<string | null> {
  c.out = c.echoed;
  for await (const t of c.q) {
    c.out += c.push(t);
    if (c.text.stopped) {
      ctx.onStop(c.index);
      break;
    }
  }
  if (!c.text.stopped && c.q.end.reason === "error") return c.q.end.error ?? "unknown error";
  c.out += c.text.flush();
  return null;
}

async function jsonResponse(choices: ChoiceState[], ctx: ResponseContext): Promise<Response> {
  const p = ctx.params;
  const errors = await Promise.all(choices.map((c) => collect(c, ctx)));
  const failed = errors.find((e) => e !== null);
  if (failed !== undefined) {
    ctx.onAbort();
    const refused = choices.find((c) => c.q.end.status === 400);
    if (refused) return errorResponse(new HttpError(400, refused.q.end.error ?? "the request was refused", "invalid_request_error"));
    return errorResponse(new HttpError(502, `generation failed: ${failed}`, "server_error"));
  }
  const created = Math.floor(Date.now() / 1000);
  const tools = toolsOf(p);
  const body = bestOf(choices, p).map(([index, c]) => {
    const logprobs = c.logprobs?.take() ?? null;
    // A finished output that holds tool calls answers with them (a cut one stays text).
    const parsed = tools && c.finish === "stop" ? parseToolCalls(tools, c.out) : null;
    const choice: Record<string, unknown> =
      p.kind !== "chat"
        ? { index, text: c.out, logprobs, finish_reason: c.finish }
        : parsed
          ? { index, message: { role: "assistant", content: parsed.content, tool_calls: parsed.calls.map(toolCallOf) }, logprobs, finish_reason: "tool_calls" }
          : { index, message: { role: "assistant", content: c.out }, logprobs, finish_reason: c.finish };
    // Always there (users check the engine at token level); return_token_ids adds the internal hop's logprobs.
    choice.token_ids = c.ids;
    if (p.returnTokenIds && c.logprobs) choice.tl_logprobs = c.wireLogprobs(0);
    return choice;
  });
  return Response.json(
    {
      id: ctx.id,
      object: p.kind === "chat" ? "chat.completion" : "text_completion",
      created,
      model: ctx.model,
      choices: body,
      usage: usage(p, choices),
      ...ctx.extra?.(),
    },
    { headers: ctx.headers },
  );
}

/** The choices returned, with their indices: per prompt, the `returned` best of its n by cumulative logprob (stable). */
function bestOf(choices: ChoiceState[], p: CompletionParams): [number, ChoiceState][] {
  if (p.returned === p.n) return choices.map((c) => [c.index, c]);
  const out: [number, ChoiceState][] = [];
  for (let k = 0; k < p.prompts.length; k++) {
    const group = choices.slice(k * p.n, (k + 1) * p.n).map((c) => [c.cumulativeLogprob, c] as const);
    group.sort((a, b) => b[0] - a[0]);
    group.slice(0, p.returned).forEach(([, c], r) => out.push([k * p.returned + r, c]));
  }
  return out;
}

function usage(p: CompletionParams, choices: ChoiceState[]) {
  const prompt = p.prompts.reduce((s, x) => s + x.length, 0);
  const completion = choices.reduce((s, c) => s + c.ids.length, 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** The SSE side of one response: each choice's chunks, interleaved as their tokens arrive. */
class ChunkWriter {
  private readonly created = Math.floor(Date.now() / 1000);
  readonly object: string;
  /** One choice failed: the error event is out and nothing more is written. */
  failed = false;

  constructor(
    private readonly ctx: ResponseContext,
    readonly send: (obj: unknown) => void,
  ) {
    this.object = ctx.params.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  }

  /**
   * One chunk of choice c: `from` is the first id it reports (token_ids and logprobs). The
   * final chunk (`finish` set) always carries the ids no chunk carried yet: with
   * return_token_ids each chunk carries its own, otherwise the final one carries them all.
   */
  chunk(c: ChoiceState, text: string | null, finish: string | null, from: number | null, first = false) {
    const p = this.ctx.params;
    const logprobs = from !== null && c.logprobs ? c.logprobs.take() : null;
    const choice: Record<string, unknown> =
      p.kind === "chat"
        ? {
            index: c.index,
            delta: finish !== null && text === null ? {} : first ? { role: "assistant", content: text ?? "" } : { content: text },
            logprobs,
            finish_reason: finish,
          }
        : { index: c.index, text: text ?? "", logprobs, finish_reason: finish };
    if (finish !== null) from = c.reported;
    if (from !== null && (p.returnTokenIds || finish !== null)) {
      choice.token_ids = c.ids.slice(from);
      if (p.returnTokenIds && c.logprobs) choice.tl_logprobs = c.wireLogprobs(from);
      c.reported = c.ids.length;
    }
    return { id: this.ctx.id, object: this.object, created: this.created, model: this.ctx.model, choices: [choice] };
  }

  usage(choices: ChoiceState[]) {
    return { id: this.ctx.id, object: this.object, created: this.created, model: this.ctx.model, choices: [], usage: usage(this.ctx.params, choices) };
  }

  /**
   * Streams choice c to its end; on its failure sends the error event and marks the response
   * failed. With tools to read calls from, text that is or may become a call is held (content
   * before it streams), and at the end the calls go out as delta.tool_calls, one chunk each,
   * with finish_reason "tool_calls"; an output that holds no valid call goes out as content.
   */
  async streamChoice(c: ChoiceState): Promise<void> {
    const p = this.ctx.params;
    const tools = toolsOf(p);
    let all = "";
    let sent = 0;
    const release = (delta: string): string => {
      if (!tools) return delta;
      all += delta;
      const safe = safeContentLength(tools, all);
      if (safe <= sent) return "";
      const out = all.slice(sent, safe);
      sent = safe;
      return out;
    };
    // A named function's arguments stream as they come (its output is nothing else), as OpenAI's do.
    const named = tools?.mode === "named" ? toolCallOf({ name: tools.name!, arguments: "" }) : null;
    let argsSent = false;
    const sendArgs = (text: string, from: number | null) => {
      const chunk = this.chunk(c, null, null, from);
      chunk.choices[0]!.delta = {
        tool_calls: [
          argsSent ? { index: 0, function: { arguments: text } } : { index: 0, ...named!, function: { name: named!.function.name, arguments: text } },
        ],
      };
      argsSent = true;
      this.send(chunk);
    };
    let first = true;
    if (p.kind === "chat") {
      this.send(this.chunk(c, "", null, null, true));
      first = false;
    } else if (c.echoed.length > 0) this.send(this.chunk(c, c.echoed, null, null));
    for await (const t of c.q) {
      if (this.failed) return;
      const from = c.ids.length;
      const text = c.push(t);
      if (named) {
        all += text;
        if (text.length > 0) sendArgs(text, from);
        else if (p.returnTokenIds || c.logprobs) this.send(this.chunk(c, "", null, from));
        if (c.text.stopped) {
          this.ctx.onStop(c.index);
          break;
        }
        continue;
      }
      const delta = release(text);
      if (delta.length > 0 || p.returnTokenIds || c.logprobs) this.send(this.chunk(c, delta, null, from, first));
      first = false;
      if (c.text.stopped) {
        this.ctx.onStop(c.index);
        break;
      }
    }
    if (this.failed) return;
    if (!c.text.stopped && c.q.end.reason === "error") {
      // Never a silent truncation: the client sees the stream fail.
      this.failed = true;
      const end = c.q.end;
      this.send(
        end.status === 400
          ? { error: { message: end.error ?? "the request was refused", type: "invalid_request_error", code: 400 } }
          : { error: { message: `generation failed: ${end.error ?? "unknown error"}`, type: "server_error", code: 502 } },
      );
      return;
    }
    let rest = c.text.flush();
    if (named) {
      all += rest;
      if (rest.length > 0 || !argsSent) sendArgs(rest, p.returnTokenIds ? c.ids.length : null);
      const done = c.finish === "stop" && parseToolCalls(tools!, all) !== null;
      this.send({ ...this.chunk(c, null, done ? "tool_calls" : c.finish, null), ...this.ctx.extra?.() });
      return;
    }
    if (tools) {
      all += rest;
      const parsed = c.finish === "stop" ? parseToolCalls(tools, all) : null;
      if (parsed) {
        parsed.calls.forEach((call, k) => {
          const chunk = this.chunk(c, null, null, null);
          chunk.choices[0]!.delta = { tool_calls: [{ index: k, ...toolCallOf(call) }] };
          this.send(chunk);
        });
        this.send({ ...this.chunk(c, null, "tool_calls", null), ...this.ctx.extra?.() });
        return;
      }
      rest = all.slice(sent);
    }
    if (rest.length > 0) this.send(this.chunk(c, rest, null, p.returnTokenIds ? c.ids.length : null));
    this.send({ ...this.chunk(c, null, c.finish, null), ...this.ctx.extra?.() });
  }
}

function streamResponse(choices: ChoiceState[], ctx: ResponseContext): Response {
  const enc = new TextEncoder();
  let done = false;
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      const w = new ChunkWriter(ctx, (obj) => controller.enqueue(enc.encode(`data: ${JSON.stringify(obj)}\n\n`)));
      try {
        await Promise.all(choices.map((c) => w.streamChoice(c)));
        if (w.failed) {
          ctx.onAbort();
          done = true;
          controller.close();
          return;
        }
        if (ctx.params.includeUsage) w.send(w.usage(choices));
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
