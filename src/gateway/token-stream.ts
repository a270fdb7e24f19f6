import { fromWire, sseData, type StreamEnd, type TokenQueue } from "../http/index.ts";

export type StreamOutcome = "accepted" | "refused" | "failed";

/** How long an engine may keep the gateway waiting; a miss runs `onMissed` and fails the stream. */
export interface StreamDeadlines {
  /** From the POST until the engine's first SSE event. */
  firstByteMs: number;
  /** Between two SSE events. */
  interTokenMs: number;
  /** A gap this long between two events already makes the engine suspect (`onMissed`), without ending the stream. */
  stallMs: number;
  onMissed: (what: string) => void;
}

/**
 * One timer for a stream's deadlines: armed for the first byte, then re-armed with
 * refresh() on each event so a token allocates nothing; its firing aborts `signal`.
 */
class Watchdog {
  readonly controller = new AbortController();
  /** The deadline that was missed, once one was. */
  missed: string | null = null;
  private first = true;
  private timer: ReturnType<typeof setTimeout>;
  private stall: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly d: StreamDeadlines) {
    this.timer = setTimeout(() => this.fire(), d.firstByteMs);
  }

  /** An event arrived: the inter-token deadline (and the stall watch) runs from now. */
  tick(): void {
    if (!this.first) {
      this.timer.refresh();
      this.stall?.refresh();
      return;
    }
    this.first = false;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.fire(), this.d.interTokenMs);
    if (this.d.stallMs < this.d.interTokenMs) this.stall = setTimeout(() => this.d.onMissed(`stalled over ${this.d.stallMs} ms`), this.d.stallMs);
  }

  stop(): void {
    clearTimeout(this.timer);
    clearTimeout(this.stall);
  }

  private fire(): void {
    this.missed = this.first ? `first byte within ${this.d.firstByteMs} ms` : `next token within ${this.d.interTokenMs} ms`;
    this.d.onMissed(this.missed);
    this.controller.abort(new Error(`missed deadline: ${this.missed}`));
  }
}

/**
 * POSTs a streaming completion with `return_token_ids` to an engine and feeds the ids
 * into `q`. A refusal, an error event, or a stream that ends without `[DONE]` closes
 * `q` with an error, so the client sees a failure and never a silent truncation.
 * `onAccepted` runs once the engine answered 200 (for a resume: it claimed the handle).
 * With several queues (n > 1), choice i's tokens go to queues[i]. Resolves, once the
 * stream ended, with "refused" (a non-200 answer), "failed" (broken, cancelled or a
 * missed deadline before the 200, or a 412: the engine cannot continue the request, another
 * may) or "accepted".
 */
export async function readTokenStream(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  queues: TokenQueue | TokenQueue[],
  signal: AbortSignal,
  onAccepted: () => void,
  deadlines?: StreamDeadlines,
): Promise<StreamOutcome> {
  const qs = Array.isArray(queues) ? queues : [queues];
  const closeAll = (end: StreamEnd) => qs.forEach((q) => q.close(end));
  const dog = deadlines ? new Watchdog(deadlines) : null;
  const both = dog ? AbortSignal.any([signal, dog.controller.signal]) : signal;
  let accepted = false;
  try {
    const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body), signal: both });
    if (res.status !== 200) {
      const text = await res.text();
      let msg = text;
      try {
        msg = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text;
      } catch {}
      // The engine's own 400 is the client's (a grammar that does not compile on a colocated
      // engine, say): its words, without the engine's address.
      closeAll(res.status === 400 ? { reason: "error", error: msg, status: 400 } : { reason: "error", error: `${url} answered ${res.status}: ${msg}` });
      // 412: this engine cannot continue the request (its structured output does not compile
      // there) and gave the blocks back; another engine may, so it is routed again.
      return res.status === 412 ? "failed" : "refused";
    }
    accepted = true;
    onAccepted();
    const finish: (string | null)[] = qs.map(() => null);
    for await (const data of sseData(res.body!)) {
      dog?.tick();
      if (data === "[DONE]") {
        qs.forEach((q, i) => q.close({ reason: finish[i] === "length" ? "length" : "stop" }));
        return "accepted";
      }
      const obj = JSON.parse(data) as {
        error?: { message?: string };
        choices?: { index?: number; token_ids?: number[]; tl_logprobs?: unknown[]; finish_reason?: string | null }[];
      };
      if (obj.error) {
        closeAll({ reason: "error", error: obj.error.message ?? "engine reported an error" });
        return "accepted";
      }
      for (const c of obj.choices ?? []) {
        const k = c.index ?? 0;
        const q = qs[k];
        if (q === undefined) throw new Error(`choice index ${k} outside 0..${qs.length - 1}`);
        const ids = c.token_ids ?? [];
        for (let i = 0; i < ids.length; i++) q.push(ids[i]!, fromWire(c.tl_logprobs?.[i]));
        if (c.finish_reason) finish[k] = c.finish_reason;
      }
    }
    closeAll({ reason: "error", error: `stream from ${url} ended without [DONE]` });
    return "accepted";
  } catch (e) {
    if (signal.aborted) closeAll({ reason: "cancelled" });
    else if (dog?.missed) closeAll({ reason: "error", error: `engine missed its deadline: ${dog.missed}` });
    else closeAll({ reason: "error", error: `stream from ${url} broke: ${e instanceof Error ? e.message : String(e)}` });
    return accepted ? "accepted" : "failed";
  } finally {
    dog?.stop();
  }
}
