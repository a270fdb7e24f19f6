export type EndReason = "stop" | "length" | "cancelled" | "error";

export interface StreamEnd {
  reason: EndReason;
  error?: string;
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

  push(token: number): void {
    if (this.ended) return;
    this.buf.push(token);
    this.notify();
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
