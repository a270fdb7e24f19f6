/**
 * Work the gateway still owes its engines after a client has gone: a handle to give back
 * once an abandoned Prefill answers, a Release on its way. stop() settles it (bounded)
 * before closing the clients that work needs, so a clean stop leaves no handle to its
 * time to live. Each tracked promise leaves the set once settled, whatever its outcome.
 */
export class PendingWork {
  private readonly open = new Set<Promise<void>>();

  get size(): number {
    return this.open.size;
  }

  track(work: Promise<unknown>): void {
    const done = (): void => {
      this.open.delete(settled);
    };
    const settled: Promise<void> = work.then(done, done);
    this.open.add(settled);
  }

  /** Waits up to `deadlineMs` until `busy()` is false and nothing is open; resolves with what is still open. */
  async settle(deadlineMs: number, busy: () => boolean = () => false): Promise<number> {
    const end = Date.now() + deadlineMs;
    while ((busy() || this.open.size > 0) && Date.now() < end) await Bun.sleep(10);
    return this.open.size;
  }
}
