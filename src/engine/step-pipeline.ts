import assert from "node:assert";
import { dropFirst } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";
import type { KvCacheManager } from "./kv-cache-manager.ts";
import { asError, type ModelPort } from "./model-port.ts";
import { Step } from "./step.ts";

export interface StepPipelineOptions {
  model: ModelPort;
  pool: KvPool;
  kv: KvCacheManager;
  /** Steps in flight at most: the one running and those posted after it (1 = none ahead). */
  depth: number;
  /** Counts the steps posted. */
  stats: { steps: number };
  /** The step after the newest in `queue`, planned while they run, or null (Scheduler.planAhead). */
  planAhead: (queue: readonly Step[]) => Step | null;
  /** A settled step's results: sampling, and what it finished. Throws only when the whole step fails. */
  postprocess: (step: Step) => void;
}

/**
 * The steps between plan and postprocess: each is posted to the model, and settled in the order
 * posted once its forward ended: its held blocks go back, it is postprocessed, and the queue is
 * filled up to `depth` again with the steps planAhead allows. Every step ended by the time a
 * settling pass runs is taken in that pass, from the model's callback, with no promise or async
 * frame per step.
 *
 * Invariant: every block of a sequence in an in-flight step stays referenced until that step
 * settles (KvCacheManager.hold until settle), steps are postprocessed in the order posted, and a
 * run ends only once none it posted is in flight, so its failure (the first, kept) never leaves
 * a step's blocks to one nobody waits for.
 */
export class StepPipeline {
  /** Steps posted and not yet postprocessed, oldest first (depth at most). */
  private readonly queue: Step[] = [];
  /** Step records free for reuse: each went through settled and postprocess (depth of them in a steady decode). */
  private readonly spare: Step[] = [];
  private readonly model: ModelPort;
  private readonly pool: KvPool;
  private readonly kv: KvCacheManager;
  private readonly depth: number;
  private readonly stats: { steps: number };
  private readonly planAhead: (queue: readonly Step[]) => Step | null;
  private readonly postprocess: (step: Step) => void;
  private readonly ended = (step: Step, sampled: Int32Array | null, error: Error | null): void => this.stepDone(step, sampled, error);
  /** The engine's own logits buffer, for a model without one (logitsBuffer). */
  private logits: Float32Array = new Float32Array(0);
  /** settleDone runs: a forward ending meanwhile is only marked, and that same pass takes it. */
  private settling = false;
  /** The run under way: how it ends, and its first failure, after which nothing more is planned or postprocessed. */
  private runEnd: (() => void) | null = null;
  private runFail: ((e: unknown) => void) | null = null;
  private runFailed = false;
  private runError: unknown = null;

  constructor(opts: StepPipelineOptions) {
    this.model = opts.model;
    this.pool = opts.pool;
    this.kv = opts.kv;
    this.depth = opts.depth;
    this.stats = opts.stats;
    this.planAhead = opts.planAhead;
    this.postprocess = opts.postprocess;
  }

  /** A free step record, emptied (its arrays keep their room), for a step `ahead` tokens past those computed. */
  take(ahead: number): Step {
    const step = this.spare.pop() ?? new Step(this.pool, this.logits, this.ended);
    step.reset(ahead);
    step.logits = this.logits;
    return step;
  }

  /** A record taken and not posted (nothing to run) is free again. */
  recycle(step: Step): void {
    this.spare.push(step);
  }

  /**
   * Posts `first`, then keeps the queue depth steps deep while each settles and is postprocessed,
   * oldest first; settles once none is left in flight. On a failure the steps posted ahead
   * settle too (failing, when they needed the failed one's tokens) before it rejects, so their
   * blocks go back now, not to a step never awaited.
   */
  run(first: Step): Promise<void> {
    assert(this.queue.length === 0 && this.runEnd === null, "a step runs while another does");
    return new Promise<void>((resolve, reject) => {
      this.runEnd = resolve;
      this.runFail = reject;
      this.runFailed = false;
      this.runError = null;
      this.settling = true;
      this.post(first);
      this.settleDone();
    });
  }

  /**
   * Queues a step and hands it to the model; its end comes through stepDone (at once for a
   * synchronous model). A post that throws is a failed step, so the steps before it settle
   * before their blocks go back.
   */
  private post(step: Step): void {
    this.queue.push(step);
    const n = step.seqs.length;
    const m = this.model;
    if (m.logitsBuffer) step.logits = m.logitsBuffer(n);
    else if (this.logits.length < n * m.vocabSize) step.logits = this.logits = new Float32Array(n * m.vocabSize);
    for (let i = 0; i < n; i++) this.kv.hold(step.seqs[i]!.kv, step);
    this.stats.steps++;
    try {
      m.post(step, step.onDone);
    } catch (e) {
      this.stepDone(step, null, asError(e));
    }
  }

  /** A step's forward ended (the model's callback, maybe during post): it is settled in order by settleDone. */
  private stepDone(step: Step, sampled: Int32Array | null, error: Error | null): void {
    step.sampled = sampled;
    step.failed = error !== null;
    step.error = error;
    step.done = true;
    if (!this.settling) this.settleDone();
  }

  /**
   * Every step whose forward ended, oldest first, in one pass: its blocks go back, it is
   * postprocessed, and the queue is filled up to depth again; the run ends once the queue is
   * empty. Runs from a model's callback, so it throws nothing: a failure is the run's.
   */
  private settleDone(): void {
    const queue = this.queue;
    this.settling = true;
    try {
      for (;;) {
        if (queue.length > 0 && !this.runFailed) this.fill();
        const head = queue[0];
        if (head === undefined) {
          this.endRun();
          return;
        }
        if (!head.done) return;
        dropFirst(queue);
        this.settleHead(head);
        // Settled and postprocessed: nothing reads the record any more.
        this.spare.push(head);
      }
    } finally {
      this.settling = false;
    }
  }

  /** The oldest step's blocks go back, and (no failure so far in the run) it is postprocessed. */
  private settleHead(head: Step): void {
    try {
      for (let i = 0; i < head.seqs.length; i++) this.kv.unhold(head.seqs[i]!.kv, head);
      this.kv.settle(head);
      if (this.runFailed) return;
      if (head.failed) throw head.error;
      this.postprocess(head);
    } catch (e) {
      this.failRun(e);
    }
  }

  /** The run's first failure is kept: nothing more is planned or postprocessed, and the run rejects with it once its steps settled. */
  private failRun(e: unknown): void {
    if (!this.runFailed) this.runError = e;
    this.runFailed = true;
  }

  /** Posts the steps planAhead allows while fewer than depth are in flight. */
  private fill(): void {
    try {
      for (let next: Step | null; this.queue.length < this.depth && (next = this.planAhead(this.queue)) !== null; ) this.post(next);
    } catch (e) {
      this.failRun(e);
    }
  }

  private endRun(): void {
    const resolve = this.runEnd!;
    const reject = this.runFail!;
    this.runEnd = this.runFail = null;
    if (this.runFailed) reject(this.runError);
    else resolve();
  }
}
