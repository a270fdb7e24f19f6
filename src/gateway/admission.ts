/**
 * The gateway's door: whether it admits completions (not once draining) and how many
 * it is serving, counted from admission until the last token streamed or the request
 * failed. drain() waits for that count to reach zero.
 */
export class Admission {
  private draining = false;
  private active = 0;

  get isDraining(): boolean {
    return this.draining;
  }

  /** One request admitted; `leave` must follow exactly once. */
  enter(): void {
    this.active++;
  }

  leave(): void {
    this.active--;
  }

  /** Refuses from now on and waits up to `deadlineMs` for the active requests; resolves with those left. */
  async drain(deadlineMs: number): Promise<number> {
    this.draining = true;
    const end = Date.now() + deadlineMs;
    while (this.active > 0 && Date.now() < end) await Bun.sleep(10);
    return this.active;
  }
}
