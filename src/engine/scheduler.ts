import type { KvCacheManager } from "./kv-cache-manager.ts";
import type { Sequence } from "./sequence.ts";
import type { Step } from "./step.ts";

export interface SchedulerOptions {
  kv: KvCacheManager;
  /** Tokens one step may process across all sequences (prefill chunks plus decodes). */
  maxBatchTokens: number;
  maxRunning: number;
  maxModelLen: number;
  /** Milliseconds on a monotonic clock (a sequence's first scheduling). */
  now: () => number;
  /** Ends a sequence the pool cannot hold even alone (the engine finishes it with this error). */
  fail: (seq: Sequence, error: string) => void;
  /** Where prefix hits and preemptions are counted (the engine's stats). */
  stats: SchedulerStats;
}

export interface SchedulerStats {
  prefixHitTokens: number;
  preemptions: number;
}

/**
 * Which sequences each step computes, and how many tokens of each: every running sequence's
 * next chunk (one token when decoding, up to the budget when prefilling), then waiting ones
 * admitted in arrival order while the token budget, maxRunning and the pool last. When blocks
 * run out the most recently admitted running sequence is preempted: its blocks go back and it
 * waits at the front to be recomputed (its rng is kept, and recompute draws nothing, so its
 * tokens stay the same).
 *
 * Invariant: a sequence is in exactly one of waiting and running, or in neither once finished;
 * a running sequence's blocks cover every token a step picked for it, and a waiting one holds
 * no blocks between steps. The scheduler never runs the model, and reaches the pool only
 * through its KvCacheManager.
 */
export class Scheduler {
  readonly waiting: Sequence[] = [];
  readonly running: Sequence[] = [];
  readonly stats: SchedulerStats;
  private readonly kv: KvCacheManager;
  private readonly maxBatchTokens: number;
  private readonly maxRunning: number;
  private readonly maxModelLen: number;
  private readonly now: () => number;
  private readonly fail: (seq: Sequence, error: string) => void;

  constructor(opts: SchedulerOptions) {
    this.kv = opts.kv;
    this.maxBatchTokens = opts.maxBatchTokens;
    this.maxRunning = opts.maxRunning;
    this.maxModelLen = opts.maxModelLen;
    this.now = opts.now;
    this.fail = opts.fail;
    this.stats = opts.stats;
  }

  get idle(): boolean {
    return this.running.length === 0 && this.waiting.length === 0;
  }

  /** Queues a new sequence behind those waiting. */
  enqueue(seq: Sequence): void {
    seq.state = "waiting";
    this.waiting.push(seq);
  }

  /** A sequence whose prompt is computed already (a resume, its blocks adopted): running at once. */
  admitComputed(seq: Sequence): void {
    seq.scheduledMs = seq.arrivedMs;
    seq.state = "running";
    this.running.push(seq);
  }

  /** Takes seq out of the queues for good (finished, cancelled or handed off). */
  remove(seq: Sequence): void {
    seq.state = "finished";
    let i = this.running.indexOf(seq);
    if (i >= 0) this.running.splice(i, 1);
    i = this.waiting.indexOf(seq);
    if (i >= 0) this.waiting.splice(i, 1);
  }

  /** Gives every block of seq back (or to its step in flight); nothing of it is computed any more. */
  freeBlocks(seq: Sequence): void {
    this.kv.free(seq.kv);
    seq.numComputed = 0;
  }

  /**
   * Fills `step` with the rows of the next step; false when there is nothing to run. Blocks are
   * reserved here (preempting when short), so the forward only reads the plan.
   */
  plan(step: Step): boolean {
    let budget = this.maxBatchTokens;
    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const seq = this.running[i]!;
      const n = Math.min(seq.tokens.length - seq.numComputed, budget);
      if (!this.reserve(seq, seq.numComputed + n)) {
        // Preemption removed seq itself (it was the newest): the loop index now points past it.
        i--;
        continue;
      }
      if (seq.state !== "running") continue;
      step.pick(seq, n);
      budget -= n;
    }
    while (budget > 0 && this.waiting.length > 0 && this.running.length < this.maxRunning) {
      const seq = this.waiting[0]!;
      if (seq.kv.count === 0) this.takePrefixHits(seq);
      const n = Math.min(seq.tokens.length - seq.numComputed, budget);
      if (this.kv.allocate(seq.kv, seq.numComputed + n) === null) {
        // Leave it waiting with nothing held, so a pool full of running work cannot deadlock it.
        this.freeBlocks(seq);
        break;
      }
      if (seq.preemptions === 0) {
        seq.prefixHitTokens = seq.numComputed;
        this.stats.prefixHitTokens += seq.numComputed;
      }
      this.waiting.shift();
      seq.scheduledMs ??= this.now();
      seq.state = "running";
      this.running.push(seq);
      step.pick(seq, n);
      budget -= n;
    }
    step.seal();
    return step.rows > 0;
  }

  /**
   * Fills `step` with the step after the newest one in flight (queue: every step not yet
   * postprocessed, oldest first), planned while they run, or returns false: every running
   * sequence decodes one more token, the one the model samples for it in that newest step. Only
   * when that is what plan() would schedule once they settle (nothing waiting, every running
   * sequence in it, sampled there by the model, none sure to finish at one of the tokens in
   * flight) and blocks need no preemption. A sequence that stops before (EOS, a stop token, a
   * cancel) has its row skipped when the step settles.
   */
  planAhead(queue: readonly Step[], step: Step): boolean {
    const last = queue[queue.length - 1]!;
    const n = last.seqs.length;
    // Each step in flight (each a sampling step for every row, or there would be none ahead) adds a token.
    const coming = queue.length;
    if (this.waiting.length > 0 || this.running.length !== n || n > this.maxBatchTokens) return false;
    for (let i = 0; i < n; i++) {
      const seq = last.seqs[i]!;
      const ends = seq.outputCount + coming >= seq.sampling.maxTokens || seq.tokens.length + coming >= this.maxModelLen;
      if (seq.state !== "running" || seq.prefillOnly || last.sampling[i] === null || ends) return false;
    }
    for (let i = 0; i < n; i++) {
      // Short: no preemption under a forward in flight; plan() decides once they settle.
      if (this.kv.allocate(last.seqs[i]!.kv, last.seqs[i]!.tokens.length + coming) === null) return false;
    }
    for (let r = 0; r < n; r++) step.pick(last.seqs[r]!, 1);
    step.seal();
    return true;
  }

  /**
   * Makes seq's blocks cover `upTo` positions, preempting the newest running sequences when the
   * pool is short. False when seq itself had to be preempted (or could not fit even alone).
   */
  private reserve(seq: Sequence, upTo: number): boolean {
    for (;;) {
      if (this.kv.allocate(seq.kv, upTo) !== null) return true;
      const victim = this.running[this.running.length - 1]!;
      if (victim === seq && this.running.length === 1) {
        // Alone and still short: the pool (less pending handles) cannot hold this sequence.
        // An error, not "length": a client must not take a cut-off stream for a finished one.
        this.fail(
          seq,
          `out of KV blocks: ${upTo} tokens need ${this.kv.shortOf(seq.kv, upTo)} more blocks, ${this.kv.available} of ${this.kv.total} available`,
        );
        return false;
      }
      this.preempt(victim);
      if (victim === seq) return false;
    }
  }

  private preempt(seq: Sequence): void {
    this.freeBlocks(seq);
    seq.preemptions++;
    this.stats.preemptions++;
    this.running.splice(this.running.indexOf(seq), 1);
    seq.state = "waiting";
    this.waiting.unshift(seq);
  }

  /** Takes references on the cached blocks that start seq's tokens; always leaves one token to compute. */
  private takePrefixHits(seq: Sequence): void {
    const B = this.kv.blockTokens;
    seq.hashUpTo(seq.tokens.length, B);
    seq.numComputed = this.kv.takePrefixHits(seq.kv, seq.hashes, Math.floor((seq.tokens.length - 1) / B)) * B;
  }
}
