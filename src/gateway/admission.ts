/**
 * The gateway's door: whether it admits completions (not once draining) and how many
 * it is serving, counted from admission until the last token streamed or the request
 * failed. drain() waits for that count to reach zero.
 */
export class Admission {
  private draining = false;
  private admitted = 0;

  /** Requests admitted and not yet left. */
  get active(): number {
    return this.admitted;
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /** One request admitted; `leave` must follow exactly once. */
  enter(): void {
    this.admitted++;
  }

  leave(): void {
    this.admitted--;
  }

  /** Refuses from now on and waits up to `deadlineMs` for the active requests; resolves with those left. */
  async drain(deadlineMs: number): Promise<number> {
    this.draining = true;
    const end = Date.now() + deadlineMs;
    while (this.admitted > 0 && Date.now() < end) await Bun.sleep(10);
    return this.admitted;
  }
}
