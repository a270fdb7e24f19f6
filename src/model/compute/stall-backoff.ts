/**
 * When a split dispatch should stay on the caller instead. A helper may claim its last chunk
 * just before the caller finds none left, so the caller may wait up to a chunk's time for it; a
 * caller that waited more than `stallMs` beyond twice its own chunks' time (cores of one machine
 * differ: on the AMD EPYC, a 512-row q4_k matmul's CPU time per call varied 1.5x between calls)
 * met a helper that lost its core mid-chunk. Counting the chunk's time matters for a prefill,
 * whose chunks take milliseconds: judged by `stallMs` alone, most of its dispatches ended in a
 * "stall", and the backoff ran the next ones on one thread (a 2048 x 2048 q4_k matmul of 512
 * rows, two threads: 42.6-46.0 ms a call on average against 35.3-40.6 without the backoff). Now and then, on a quiet machine, that is the scheduler's noise (a JIT or GC thread
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
