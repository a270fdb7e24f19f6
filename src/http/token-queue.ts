import type { TokenLogprobs } from "../rng/index.ts";

export type EndReason = "stop" | "length" | "cancelled" | "error";

export interface StreamEnd {
  reason: EndReason;
  error?: string;
  /** 400: the failure is the request's own (an engine refused it before any work), and the client hears so. */
  status?: 400;
}

/**
 * Tokens from a producer (the engine loop, or a decode engine's stream) to one HTTP
 * response, in order, without dropping any: the producer never waits, the consumer
 * awaits the next token or the end.
 */
export class TokenQueue implements AsyncIterable<number> {
  private readonly buf: number[] = [];
  private wake: (() => void) | null = null;
  private ended: StreamEnd | null = null;
  /** Logprobs by position in the stream, when the producer has them. */
  private readonly logprobs: (TokenLogprobs | undefined)[] = [];
  private pushed = 0;

  push(token: number, logprobs?: TokenLogprobs): void {
    if (this.ended) return;
    if (logprobs) this.logprobs[this.pushed] = logprobs;
    this.pushed++;
    this.buf.push(token);
    this.notify();
  }

  /** The logprobs of the i-th token pushed (0-based), if its producer gave them. */
  logprobsAt(i: number): TokenLogprobs | undefined {
    return this.logprobs[i];
  }

  close(end: StreamEnd): void {
    if (this.ended) return;
    this.ended = end;
    this.notify();
  }

  /** How the stream ended; valid once iteration is over. */
  get end(): StreamEnd {
    return this.ended ?? { reason: "error", error: "stream still open" };
  }

  async *[Symbol.asyncIterator](): AsyncIterator<number> {
    for (;;) {
      if (this.buf.length > 0) {
        yield this.buf.shift()!;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  private notify(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }
}
