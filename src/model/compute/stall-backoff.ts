/**
 * When a split dispatch should stay on the caller instead. A helper may claim its last chunk
 * just before the caller finds none left, so the caller may wait up to a chunk's time for it. A
 * caller that waited more than `stallMs` beyond twice its own time a chunk (cores of one machine
 * differ: on the AMD EPYC, one 512-row q4_k matmul's CPU time varied 1.5x from call to call) met
 * a helper that lost its core mid-chunk. (Judged by `stallMs` alone, most of a prefill's
 * dispatches, whose chunks take milliseconds, ended in a "stall" and the next ones ran on one
 * thread: a 2048 x 2048 q4_k matmul of 512 rows on two threads took 42.6-46.0 ms a call on
 * average, 40.9-42.6 judged by the chunk, 40.4-41.2 with no backoff.) Now and then, on a quiet
 * machine, such a stall is the scheduler's noise (a JIT or GC thread took the core for a moment)
 * and a short backoff costs little, where a long one would run a quiet machine's decode on one
 * thread for no reason. Stalls close together mean an oversubscribed machine, where waiting out
 * time slices costs more than running alone. So the backoff doubles with each
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

  /**
   * A split dispatch ended at `now` (ms) after the caller waited `waitedMs` for helpers' chunks,
   * its own taking `chunkMs` each (0: unknown or tiny).
   */
  note(waitedMs: number, now: number, chunkMs = 0): void {
    if (waitedMs <= this.stallMs + 2 * chunkMs) return;
    // Within maxMs of the last backoff's end: the same bout of contention.
    this.streak = now - this.until <= this.maxMs ? this.streak + 1 : 1;
    this.until = now + this.currentMs;
  }

  /** The backoff the last stall set (ms). */
  get currentMs(): number {
    return this.streak === 0 ? 0 : Math.min(this.maxMs, this.minMs * 2 ** (this.streak - 1));
  }
}
