/**
 * When a split dispatch should stay on the caller instead. A caller that waited more than
 * `stallMs` for a helper's chunk after finishing its own share met a helper that lost its core
 * mid-chunk. Now and then, on a quiet machine, that is the scheduler's noise (a JIT or GC thread
 * took the core for a moment) and a short backoff costs little, where a long one would run a
 * quiet machine's decode on one thread for no reason. Stalls close together mean an oversubscribed machine,
 * where waiting out time slices costs more than running alone. So the backoff doubles with each
 * stall that comes within `maxMs` of the last backoff's end, from `minMs` up to `maxMs`, and starts
 * again from `minMs` after `maxMs` without a stall.
 */
export class StallBackoff {
  private streak = 0;
  private until = 0;

  constructor(
    private readonly stallMs = 0.5,
    private readonly minMs = 2,
    private readonly maxMs = 50,
  ) {}

  /** Whether a dispatch may be split at `now` (ms). */
  available(now: number): boolean {
    return now >= this.until;
  }

  /** A split dispatch ended at `now` (ms) after the caller waited `waitedMs` for helpers' chunks. */
  note(waitedMs: number, now: number): void {
    if (waitedMs <= this.stallMs) return;
    // Within maxMs of the last backoff's end: the same bout of contention.
    this.streak = now - this.until <= this.maxMs ? this.streak + 1 : 1;
    this.until = now + this.currentMs;
  }

  /** The backoff the last stall set (ms). */
  get currentMs(): number {
    return this.streak === 0 ? 0 : Math.min(this.maxMs, this.minMs * 2 ** (this.streak - 1));
  }
}
