import assert from "node:assert";
import type { TokenMatcher } from "../grammar/index.ts";
import {
  applyTokenBitmask,
  choiceSeed,
  LogitsError,
  maskStops,
  processLogits,
  resumeRng,
  sample,
  stream,
  SAMPLE_STREAM,
  tokenLogprobs,
  type TokenLogprobs,
} from "../rng/index.ts";
import { dropFirst, SAMPLE_FAILED } from "../model/index.ts";
import type { KvPool } from "../pool/index.ts";
import { type ForwardDone, LogitsRows, type ModelRunner, prevToken, type RowSampling, type SeqChunk } from "./model-runner.ts";
import { Sequence, type Finish, type FinishReason, type SamplingParams } from "./sequence.ts";

/**
 * A step from plan to postprocess: what the scheduler hands the model runner, and what the
 * forward leaves for postprocess. The records are reused (Engine.spare) once their step settled
 * and was postprocessed, their arrays refilled in place, so a steady decode allocates none per step.
 */
interface StepPlan {
  /** Per row: its sequence, and how many of its tokens (from numComputed) the step computes. */
  readonly seqs: Sequence[];
  readonly counts: number[];
  /** Per row: the sequence's chunk (its own record, overwritten by its next step once this one is posted). */
  readonly batch: SeqChunk[];
  /** Per row: how the model samples it itself, or null (a pipelined model; see modelSamples). */
  readonly sampling: (RowSampling | null)[];
  /** Rows filled so far while the plan is built. */
  rows: number;
  /** Where forward writes the logits, one row per chunk. */
  logits: Float32Array;
  /** The forward ended (or failed: `failed`, with `error`); sampled holds the tokens the model sampled, if it did. */
  done: boolean;
  failed: boolean;
  error: unknown;
  /** The tokens the model sampled for those rows, once the forward settled. */
  sampled: Int32Array | null;
  /**
   * The record's own ends of its forward, made with it and reused by every step it carries: the
   * model's callback (ModelRunner.post), and a promise's fulfilment and rejection.
   */
  readonly onDone: ForwardDone;
  readonly onFulfilled: (sampled: unknown) => void;
  readonly onRejected: (e: unknown) => void;
  /** Blocks given back while this step ran, released when it settles. */
  readonly deferred: number[];
  /**
   * Tokens in flight before this step's, 0 unless planned ahead (decodes only: then its tokens
   * may be streamed together with the next step's).
   */
  ahead: number;
}

export interface EngineOptions {
  model: ModelRunner;
  pool: KvPool;
  /** Tokens one step may process across all sequences (prefill chunks plus decodes): max_batch_tokens. */
  maxBatchTokens: number;
  maxRunning?: number;
  maxModelLen: number;
  /** Token ids that end every request (the tokenizer's EOS). */
  eosTokenIds?: readonly number[];
  /** Milliseconds on a monotonic clock, for queue and end-to-end times (default performance.now). */
  now?: () => number;
  /**
   * Steps a pipelined model (forwardPipelined) may hold in flight: the one running and those
   * posted after it (default 3, at most the model's pipelineDepth; 1 = none ahead). A decode
   * wakes this thread once per depth - 1 steps (the steps posted ahead are lazy), so a token
   * reaches its client at most depth - 2 steps after it is sampled. 3 is the deepest that keeps
   * that within one step. Each wake costs ~110 us of this thread's CPU and, on a machine with no
   * idle core, ~140 us of the model thread's (this thread then mostly runs on its core: measured
   * by bench/engine-loop); depth 4 saves a third of the wakes for a second step of streaming delay.
   * Nearly all of a wake's cost is the runtime's and the kernel's, not the settling of its two
   * steps (a callback each, no promise).
   */
  pipelineDepth?: number;
}

export interface EngineRequest {
  requestId: string;
  promptTokens: readonly number[];
  sampling: SamplingParams;
  /** Stop after the first token and hand the prompt's blocks to the caller. */
  prefillOnly?: boolean;
  /** Prefill only: sample this many first tokens (choice j from stream(seed + j)); default 1. */
  choices?: number;
  /** Continue a request another engine prefilled: the caller gives its references on blockIds. */
  resume?: { blockIds: number[]; firstToken: number; draws: number };
  /** Each emitted token, with its logprobs when the sampling params ask for them. */
  onToken?: (token: number, logprobs?: TokenLogprobs) => void;
  /**
   * A structured output: every token is sampled under this matcher's mask and advances it
   * (a resume's first token is replayed into it first). The engine owns it from here and
   * disposes it when the request ends, whichever way.
   */
  constraint?: TokenMatcher;
}

export interface EngineStats {
  steps: number;
  prefillTokens: number;
  decodeTokens: number;
  prefixHitTokens: number;
  preemptions: number;
}

/**
 * Continuous batching over a paged pool. Each step takes every running sequence's
 * next chunk (one token when decoding, up to the budget when prefilling), then admits
 * waiting sequences while the token budget lasts, runs one forward over the whole
 * batch, samples where a chunk reached the end of its tokens, and frees what finished.
 * When blocks run out, the most recently admitted running sequence is preempted: its
 * blocks go back and it waits at the front to be recomputed (its rng is kept, and
 * recompute draws nothing, so its tokens stay the same).
 *
 * A model on another thread makes the forward asynchronous; the engine keeps serving meanwhile.
 * Such a model may also be pipelined: while a step of decodes runs, the next one is posted
 * (planAhead), its tokens named as "what the model samples for row r", so the model thread goes
 * from one forward to the next without waiting on this thread.
 * Invariant: every block of a sequence in an in-flight batch stays referenced until that forward
 * settles, so a cancel or finish meanwhile defers giving its blocks back (giveBack, to the newest
 * in-flight step holding the sequence), and no block the model thread may still write is zeroed,
 * imported into or handed to another request.
 */
/** Ids of the model thread's matchers (ModelRunner.openConstraint), one per constrained sequence. */
let nextConstraintId = 1;

export class Engine {
  readonly pool: KvPool;
  readonly model: ModelRunner;
  readonly maxModelLen: number;
  readonly stats: EngineStats = { steps: 0, prefillTokens: 0, decodeTokens: 0, prefixHitTokens: 0, preemptions: 0 };
  private readonly maxBatchTokens: number;
  private readonly maxRunning: number;
  private readonly depth: number;
  private readonly eos: Set<number>;
  private readonly waiting: Sequence[] = [];
  private readonly running: Sequence[] = [];
  private readonly byId = new Map<string, Sequence>();
  private scheduled = false;
  /** A step is under way (its forward may be running on another thread). */
  private stepping = false;
  /** The engine's own logits buffer, for a model without one (logitsBuffer). */
  private logits: Float32Array = new Float32Array(0);
  /** Scratch for one sequence's processed logits (penalties, bias, min_tokens). */
  private processed = new Float32Array(0);
  private draining = false;
  private readonly now: () => number;
  private readonly finishListeners: ((f: Finish) => void)[] = [];
  /** Steps posted and not yet postprocessed, oldest first (depth at most). */
  private readonly queue: StepPlan[] = [];
  /** Step records free for reuse: each went through settled and postprocess (depth of them in a steady decode). */
  private readonly spare: StepPlan[] = [];
  /** Row views of each logits buffer forwards wrote (a model thread's slots rotate several). */
  private readonly rows: LogitsRows;
  private readonly loop = (): void => void this.loopOnce();
  /** settleDone runs: a forward ending meanwhile is only marked, and that same pass takes it. */
  private settling = false;
  /** The run under way (run): how it ends, and its first failure, after which nothing more is planned or postprocessed. */
  private runEnd: (() => void) | null = null;
  private runFail: ((e: unknown) => void) | null = null;
  private runFailed = false;
  private runError: unknown = null;

  constructor(opts: EngineOptions) {
    this.model = opts.model;
    this.pool = opts.pool;
    this.maxModelLen = opts.maxModelLen;
    this.maxBatchTokens = opts.maxBatchTokens;
    this.maxRunning = opts.maxRunning ?? 64;
    this.eos = new Set(opts.eosTokenIds ?? []);
    this.now = opts.now ?? (() => performance.now());
    this.rows = new LogitsRows(this.model.vocabSize);
    this.depth = this.model.forwardPipelined ? Math.max(1, Math.min(opts.pipelineDepth ?? 3, this.model.pipelineDepth ?? 2)) : 1;
    assert(this.maxBatchTokens >= 1);
  }

  get queueDepth(): number {
    return this.waiting.length;
  }
  get runningCount(): number {
    return this.running.length;
  }
  get inFlight(): number {
    return this.byId.size;
  }
  get isDraining(): boolean {
    return this.draining;
  }
  requestIds(): string[] {
    return [...this.byId.keys()];
  }
  has(requestId: string): boolean {
    return this.byId.has(requestId);
  }

  /** Calls `listener` with every request's Finish (for metrics), after the request's own promise settles. */
  onFinish(listener: (f: Finish) => void): void {
    this.finishListeners.push(listener);
  }

  /** Queues a request; the promise settles when it finishes, is cancelled or fails. */
  submit(req: EngineRequest): Promise<Finish> {
    assert(!this.byId.has(req.requestId), `request ${req.requestId} already in flight`);
    const B = this.pool.shape.blockTokens;
    return new Promise<Finish>((resolve) => {
      const s = req.sampling;
      const seeded = s.temperature > 0;
      const rng = !seeded ? null : req.resume ? resumeRng(s.seed, req.resume.draws) : stream(s.seed, SAMPLE_STREAM);
      const seq = new Sequence(
        req.requestId,
        req.promptTokens,
        s,
        rng,
        req.promptTokens.length,
        req.prefillOnly ?? false,
        req.choices ?? 1,
        req.onToken ?? (() => {}),
        (f) => {
          resolve(f);
          for (const listen of this.finishListeners) listen(f);
        },
        this.model.vocabSize,
      );
      seq.arrivedMs = this.now();
      if (req.constraint) {
        seq.constraint = req.constraint;
        seq.mask = new Int32Array(req.constraint.words);
      }
      if (req.resume && seq.constraint && !seq.constraint.accept(req.resume.firstToken)) {
        seq.constraint.dispose();
        this.pool.releaseAll(req.resume.blockIds);
        seq.onFinish({ ...this.summary(seq, "error"), error: `the first token ${req.resume.firstToken} does not fit the request's structured output` });
        return;
      }
      if (!req.resume && Math.ceil((seq.promptLen + 1) / B) > this.pool.total) {
        seq.constraint?.dispose();
        seq.onFinish({ ...this.summary(seq, "error"), error: `prompt of ${seq.promptLen} tokens does not fit a pool of ${this.pool.total} blocks` });
        return;
      }
      this.byId.set(seq.requestId, seq);
      if (req.resume) {
        const r = req.resume;
        assert(r.blockIds.length === Math.ceil(seq.promptLen / B), "resume blocks do not cover the prompt");
        seq.blockTable = [...r.blockIds];
        seq.numComputed = seq.promptLen;
        seq.hashUpTo(seq.promptLen, B);
        seq.draws = r.draws;
        seq.resumed = true;
        seq.scheduledMs = seq.arrivedMs;
        seq.state = "running";
        this.running.push(seq);
        // The first token was sampled and emitted elsewhere; it is only the next input here.
        if (this.appendToken(seq, r.firstToken, false)) this.kick();
        return;
      }
      this.waiting.push(seq);
      this.kick();
    });
  }

  /** Cancels a request wherever it is and frees its blocks; false when unknown. */
  cancel(requestId: string, reason: FinishReason = "cancelled", error?: string): boolean {
    const seq = this.byId.get(requestId);
    if (!seq) return false;
    this.finish(seq, reason, error);
    return true;
  }

  /** Stops admitting new requests; resolves with the count still in flight at the deadline. */
  async drain(deadlineMs: number): Promise<number> {
    this.draining = true;
    const end = Date.now() + Math.max(0, deadlineMs);
    while (this.byId.size > 0 && Date.now() < end) await Bun.sleep(Math.min(10, end - Date.now()));
    return this.byId.size;
  }

  private kick(): void {
    if (this.scheduled || this.stepping) return;
    this.scheduled = true;
    setImmediate(this.loop);
  }

  private async loopOnce(): Promise<void> {
    this.scheduled = false;
    if (this.running.length === 0 && this.waiting.length === 0) return;
    this.stepping = true;
    try {
      await this.step();
    } catch (e) {
      // A model failure must not strand requests or their blocks.
      const msg = e instanceof Error ? e.message : String(e);
      for (const seq of [...this.running, ...this.waiting]) this.finish(seq, "error", msg);
    } finally {
      this.stepping = false;
    }
    if (this.running.length > 0 || this.waiting.length > 0) this.kick();
  }

  /**
   * One scheduling step and its forward, then (a pipelined model) the steps planned ahead while
   * each forward ran; exposed for tests that drive the loop by hand.
   */
  async step(): Promise<void> {
    const first = this.plan();
    if (first === null) return;
    await this.run(first);
  }

  /**
   * Posts `first`, then keeps the queue depth steps deep while each settles and is postprocessed,
   * oldest first (settleDone, run by the forwards' ends: no promise or async frame per step);
   * settles once none is left in flight. On a failure the steps posted ahead settle too
   * (failing, when they needed the failed one's tokens) before it rejects, so their blocks go
   * back now, not to a step never awaited.
   */
  private run(first: StepPlan): Promise<void> {
    assert(this.queue.length === 0 && this.runEnd === null, "step() while another step runs");
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

  /** Queues a step fresh from takePlan and hands it to the model; its end comes through stepDone. */
  private post(plan: StepPlan): void {
    this.queue.push(plan);
    this.forward(plan);
  }

  /** A step's forward ended (the model's callback, maybe during post): it is settled in order by settleDone. */
  private stepDone(plan: StepPlan, sampled: Int32Array | null, failed: boolean, error: unknown): void {
    plan.sampled = sampled;
    plan.failed = failed;
    plan.error = error;
    plan.done = true;
    if (!this.settling) this.settleDone();
  }

  /**
   * Every step whose forward ended, oldest first, in one pass: its blocks go back (release), it
   * is postprocessed, and the queue is filled up to depth again; the run ends once the queue is
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
  private settleHead(head: StepPlan): void {
    try {
      this.release(head);
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
      for (let next: StepPlan | null; this.queue.length < this.depth && (next = this.planAhead(this.queue)) !== null; ) this.post(next);
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

  /** A step's forward settled: its sequences' blocks are the engine's again, and those that ended while it ran go back. */
  private release(plan: StepPlan): void {
    for (let i = 0; i < plan.seqs.length; i++) {
      const seq = plan.seqs[i]!;
      if (seq.inFlightStep === plan) seq.inFlightStep = null;
    }
    if (plan.deferred.length > 0) {
      this.pool.releaseAll(plan.deferred);
      plan.deferred.length = 0;
    }
  }

  /**
   * The scheduler's half of a step: each running sequence's next chunk, then waiting ones
   * admitted while the token budget and the pool last; blocks are reserved here (preempting when
   * short), so the forward only reads the plan. Null when there is nothing to run.
   */
  private plan(): StepPlan | null {
    const B = this.pool.shape.blockTokens;
    let budget = this.maxBatchTokens;
    const plan = this.takePlan(0);

    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const seq = this.running[i]!;
      const n = Math.min(seq.tokens.length - seq.numComputed, budget);
      if (!this.reserve(seq, seq.numComputed + n)) {
        // Preemption removed seq itself (it was the newest): the loop index now points past it.
        i--;
        continue;
      }
      if (seq.state !== "running") continue;
      this.addNext(plan, seq, n);
      budget -= n;
    }

    while (budget > 0 && this.waiting.length > 0 && this.running.length < this.maxRunning) {
      const seq = this.waiting[0]!;
      if (seq.blockTable.length === 0) this.takePrefixHits(seq, B);
      const n = Math.min(seq.tokens.length - seq.numComputed, budget);
      if (!this.grow(seq, seq.numComputed + n)) {
        // Leave it waiting with nothing held, so a pool full of running work cannot deadlock it.
        this.releaseBlocks(seq);
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
      this.addNext(plan, seq, n);
      budget -= n;
    }
    this.sealRows(plan);
    if (plan.rows > 0) return plan;
    this.spare.push(plan);
    return null;
  }

  /**
   * The step after the newest one in flight (queue: every step not yet postprocessed, oldest
   * first), planned while they run, or null: every running sequence decodes one more token, the
   * one the model samples for it in that newest step. Only when that is what plan() would
   * schedule once they settle (nothing waiting, every running sequence in it, sampled there
   * by the model, none sure to finish at one of the tokens in flight) and blocks need no
   * preemption. A sequence that stops before (EOS, a stop token, a cancel) has its row skipped.
   */
  private planAhead(queue: readonly StepPlan[]): StepPlan | null {
    const last = queue[queue.length - 1]!;
    const n = last.seqs.length;
    // Each step in flight (each a sampling step for every row, or there would be none ahead) adds a token.
    const coming = queue.length;
    if (this.waiting.length > 0 || this.running.length !== n || n > this.maxBatchTokens) return null;
    for (let i = 0; i < n; i++) {
      const seq = last.seqs[i]!;
      const ends = seq.outputCount + coming >= seq.sampling.maxTokens || seq.tokens.length + coming >= this.maxModelLen;
      if (seq.state !== "running" || seq.prefillOnly || last.sampling[i] === null || ends) return null;
    }
    for (let i = 0; i < n; i++) {
      const seq = last.seqs[i]!;
      // Short: no preemption under a forward in flight; plan() decides once they settle.
      if (!this.grow(seq, seq.tokens.length + coming)) return null;
    }
    const plan = this.takePlan(coming);
    for (let r = 0; r < n; r++) {
      const seq = last.seqs[r]!;
      this.addRow(plan, seq, 1, seq.chunkAt(seq.tokens.length + coming - 1, 1, prevToken(r)), true);
    }
    this.sealRows(plan);
    return plan;
  }

  /** A free step record, emptied (its arrays keep their room), for a step `ahead` tokens past those computed. */
  private takePlan(ahead: number): StepPlan {
    const plan = this.spare.pop() ?? this.newPlan();
    plan.rows = 0;
    plan.logits = this.logits;
    plan.done = plan.failed = false;
    plan.error = plan.sampled = null;
    plan.ahead = ahead;
    return plan;
  }

  private newPlan(): StepPlan {
    const plan: StepPlan = {
      seqs: [],
      counts: [],
      batch: [],
      sampling: [],
      rows: 0,
      logits: this.logits,
      done: false,
      failed: false,
      error: null,
      sampled: null,
      deferred: [],
      ahead: 0,
      onDone: (sampled, error) => this.stepDone(plan, sampled, error !== null, error),
      onFulfilled: (sampled) => this.stepDone(plan, sampled instanceof Int32Array ? sampled : null, false, null),
      onRejected: (e) => this.stepDone(plan, null, true, e),
    };
    return plan;
  }

  /**
   * Row plan.rows: seq computes `n` tokens as `chunk`; a pipelined model samples the row itself
   * when `samples` (the chunk ends at its tokens) and modelSamples allows, from the request's
   * stream as it will stand the plan's ahead tokens on (each of them one draw, when it draws).
   */
  private addRow(plan: StepPlan, seq: Sequence, n: number, chunk: SeqChunk, samples: boolean): void {
    const r = plan.rows++;
    const ahead = plan.ahead;
    plan.seqs[r] = seq;
    plan.counts[r] = n;
    plan.batch[r] = chunk;
    const modelSamples = this.model.forwardPipelined !== undefined && this.modelSamples(seq, samples, ahead);
    if (modelSamples && seq.constraint && seq.constraintId === 0) {
      // Its first row the model samples (ahead is 0: every output token is known): the model
      // thread builds its own matcher, with the output so far taken.
      seq.constraintId = nextConstraintId++;
      this.model.openConstraint!(seq.constraintId, seq.constraint, seq.tokens.slice(seq.promptLen));
    }
    plan.sampling[r] = modelSamples ? seq.rowSampling(ahead) : null;
  }

  /** Row plan.rows: seq's next n tokens from those computed, sampled after when they are its last. */
  private addNext(plan: StepPlan, seq: Sequence, n: number): void {
    this.addRow(plan, seq, n, seq.chunkAt(seq.numComputed, n), seq.numComputed + n === seq.tokens.length);
  }

  /**
   * Cuts the arrays to the rows filled (a steady decode fills as many each step: nothing moves,
   * and no length is set, each set being a call into the runtime).
   */
  private sealRows(plan: StepPlan): void {
    const n = plan.rows;
    if (plan.seqs.length !== n) plan.seqs.length = plan.counts.length = plan.batch.length = plan.sampling.length = n;
  }

  /**
   * The model may sample seq's next token itself when the step samples it (`samples`) and
   * sampleNext would sample the raw logits with the request's stream: no logits processing, no
   * min_tokens mask, one choice (`ahead` tokens are appended before this one: the mask counts
   * them); a structured output when the model can mask it (openConstraint), from a step whose
   * every earlier output token is known (so its matcher there can be built with them).
   */
  private modelSamples(seq: Sequence, samples: boolean, ahead: number): boolean {
    const s = seq.sampling;
    const constrained = seq.constraint === null || (this.model.openConstraint !== undefined && (seq.constraintId !== 0 || ahead === 0));
    return samples && seq.processing === null && constrained && seq.prefillChoices === 1 && seq.outputCount + ahead >= (s.minTokens ?? 0);
  }

  /**
   * The model runner's half: one forward over the plan's batch into its logits buffer; its end
   * (at once for a synchronous model) comes through the plan's onDone. A forward that throws as
   * it is posted is a failed step, so the steps before it settle before their blocks go back.
   */
  private forward(plan: StepPlan): void {
    const n = plan.seqs.length;
    const V = this.model.vocabSize;
    const m = this.model;
    if (m.logitsBuffer) plan.logits = m.logitsBuffer(n);
    else if (this.logits.length < n * V) plan.logits = this.logits = new Float32Array(n * V);
    for (let i = 0; i < n; i++) plan.seqs[i]!.inFlightStep = plan;
    this.stats.steps++;
    // A prefill's first token streams at once; decodes planned ahead may stream in pairs.
    const lazy = plan.ahead > 0;
    let pending: Promise<unknown> | undefined;
    try {
      if (m.post) {
        m.post(this.pool, plan.batch, plan.logits, plan.sampling, lazy, plan.onDone);
        return;
      }
      if (m.forwardPipelined) pending = m.forwardPipelined(this.pool, plan.batch, plan.logits, plan.sampling, lazy);
      else pending = m.forward(this.pool, plan.batch, plan.logits) ?? undefined;
    } catch (e) {
      pending = Promise.reject(e);
    }
    if (pending) {
      pending.then(plan.onFulfilled, plan.onRejected);
      return;
    }
    this.stepDone(plan, null, false, null);
  }

  /**
   * After the forward: the one place computed positions are recorded (fills, and hashes of
   * newly full blocks registered for prefix hits), then sampling where a chunk reached the end
   * of its tokens. A sequence cancelled meanwhile is skipped. Logits one sequence cannot be
   * sampled from (LogitsError) end that sequence alone, with the error; the step goes on for
   * the others, whose tokens are what they would have been without it.
   */
  private postprocess(plan: StepPlan): void {
    const B = this.pool.shape.blockTokens;
    for (let i = 0; i < plan.seqs.length; i++) {
      const seq = plan.seqs[i]!;
      const n = plan.counts[i]!;
      if (seq.state !== "running") continue;
      if (seq.numComputed >= seq.promptLen) this.stats.decodeTokens += n;
      else this.stats.prefillTokens += n;
      const from = seq.numComputed;
      seq.numComputed += n;
      this.markComputed(seq, from, B);
      if (seq.numComputed < seq.tokens.length) continue;
      // The model thread could not sample the row (SAMPLE_FAILED): sampled here from the same raw logits, it fails the same way.
      const sampled = plan.sampling[i] ? plan.sampled![i]! : -1;
      try {
        this.sampleNext(seq, plan.logits, i, sampled === SAMPLE_FAILED ? -1 : sampled);
      } catch (e) {
        if (!(e instanceof LogitsError)) throw e;
        // Its blocks go back once every step holding it settled (giveBack); a step planned
        // ahead with its row computes a stand-in token there, and skips it when it settles.
        this.finish(seq, "error", e.message, e.byRequest ? "request" : "model");
      }
    }
  }

  /**
   * Processes a copy of the logits as the request asks (the model's own stay intact for
   * logprobs), samples (the draw count depends on the temperature alone), and appends.
   * `sampled` >= 0: the model sampled this token already (modelSamples said it may). The logits
   * are row `row` of `rows`.
   */
  private sampleNext(seq: Sequence, rows: Float32Array, row: number, sampled: number): void {
    const s = seq.sampling;
    if (sampled >= 0) {
      // The model drew its one uniform from a copy of the stream: this one takes the same draw.
      // Its token came from the raw logits (modelSamples), read here for logprobs alone.
      if (seq.rng) {
        seq.rng.uniformF64();
        seq.draws++;
      }
      // The model masked it with its own matcher: this one takes it too, and refuses what the grammar does not allow.
      if (seq.constraint && !seq.constraint.accept(sampled)) {
        this.finish(seq, "error", `structured output: the grammar refused token ${sampled} (sampled on the model thread)`, "model");
        return;
      }
      this.appendToken(seq, sampled, true, s.topLogprobs === undefined ? undefined : tokenLogprobs(this.rows.row(rows, row), sampled, s.topLogprobs));
      return;
    }
    const raw = this.rows.row(rows, row);
    const masked = seq.outputCount < (s.minTokens ?? 0);
    const constraint = seq.constraint;
    let logits = raw;
    if (seq.processing || masked || constraint) {
      if (this.processed.length !== raw.length) this.processed = new Float32Array(raw.length);
      logits = this.processed;
      logits.set(raw);
      if (seq.processing) processLogits(logits, seq.processing, seq.history!);
      if (masked) {
        if (!s.ignoreEos) maskStops(logits, this.eos);
        maskStops(logits, s.stopTokenIds);
      }
      if (constraint) {
        constraint.fillMask(seq.mask!);
        // A dead end (min_tokens holding back the only way the grammar can end, say) ends this sequence alone.
        if (applyTokenBitmask(logits, seq.mask!) === 0) {
          this.finish(seq, "error", "structured output: no token the grammar allows is possible here", "request");
          return;
        }
      }
    }
    const token = sample(logits, s, seq.rng);
    if (seq.rng) seq.draws++;
    if (constraint && !constraint.accept(token)) {
      this.finish(seq, "error", `structured output: the grammar refused token ${token}`, "model");
      return;
    }
    // One prefill for n choices: the others' first tokens come from the same logits, each
    // from its own stream with the same draw count as choice 0's.
    for (let j = 1; j < seq.prefillChoices; j++) {
      const t = sample(logits, s, seq.rng ? stream(choiceSeed(s.seed, j), SAMPLE_STREAM) : null);
      const logprobs = s.topLogprobs === undefined ? undefined : tokenLogprobs(raw, t, s.topLogprobs);
      seq.moreChoices.push({ token: t, logprobs, finished: this.isStop(seq, t) || s.maxTokens <= 1 });
    }
    this.appendToken(seq, token, true, s.topLogprobs === undefined ? undefined : tokenLogprobs(raw, token, s.topLogprobs));
  }

  /**
   * References a resumed prompt's blocks once more, for one more sequence of the same
   * prompt (n > 1 after one prefill): full blocks are shared read-only, a partial tail is
   * copied since each sequence writes its own tokens there. Null when no block is free.
   */
  sharePrompt(blockIds: readonly number[], promptLen: number): number[] | null {
    const full = Math.floor(promptLen / this.pool.shape.blockTokens);
    const out = blockIds.slice(0, full);
    if (full < blockIds.length) {
      const tail = blockIds[full]!;
      const copy = this.pool.importBlock(this.pool.payload(tail), this.pool.fillOf(tail));
      if (copy < 0) return null;
      out.push(copy);
    }
    for (let b = 0; b < full; b++) this.pool.acquire(out[b]!);
    return out;
  }

  private isStop(seq: Sequence, token: number): boolean {
    return (!seq.sampling.ignoreEos && this.eos.has(token)) || seq.sampling.stopTokenIds.includes(token);
  }

  /** Records a sampled token; false when it finished the sequence. */
  private appendToken(seq: Sequence, token: number, emit: boolean, logprobs?: TokenLogprobs): boolean {
    seq.tokens.push(token);
    seq.outputCount++;
    seq.history?.add(token);
    if (emit) seq.onToken(token, logprobs);
    const stopped = this.isStop(seq, token);
    if (seq.prefillOnly) {
      this.finishPrefill(seq, token, stopped || seq.outputCount >= seq.sampling.maxTokens, logprobs);
      return false;
    }
    if (stopped) this.finish(seq, "stop");
    else if (seq.outputCount >= seq.sampling.maxTokens || seq.tokens.length >= this.maxModelLen) this.finish(seq, "length");
    return seq.state !== "finished";
  }

  private finishPrefill(seq: Sequence, firstToken: number, finished: boolean, firstLogprobs?: TokenLogprobs): void {
    const B = this.pool.shape.blockTokens;
    const blockIds = seq.blockTable.slice(0, Math.ceil(seq.promptLen / B));
    const extra = seq.blockTable.slice(blockIds.length);
    this.giveBack(seq, extra);
    seq.blockTable = [];
    const hashes = seq.hashes.slice(0, Math.floor(seq.promptLen / B));
    this.remove(seq);
    const choices = [{ token: firstToken, logprobs: firstLogprobs, finished }, ...seq.moreChoices];
    const all = choices.every((c) => c.finished);
    if (all) this.giveBack(seq, blockIds);
    seq.onFinish({
      ...this.summary(seq, all ? "stop" : "prefilled"),
      prefill: { blockIds: all ? [] : blockIds, hashes, firstToken, draws: seq.draws, finished: all, firstLogprobs, choices },
    });
  }

  private finish(seq: Sequence, reason: FinishReason, error?: string, errorKind?: Finish["errorKind"]): void {
    if (seq.state === "finished") return;
    this.releaseBlocks(seq);
    this.remove(seq);
    seq.onFinish({ ...this.summary(seq, reason), error, ...(errorKind ? { errorKind } : {}) });
  }

  private summary(seq: Sequence, reason: FinishReason): Finish {
    return {
      reason,
      promptTokens: seq.promptLen,
      outputTokens: seq.outputTokens,
      prefixHitTokens: seq.prefixHitTokens,
      preemptions: seq.preemptions,
      resumed: seq.resumed,
      queueMs: seq.scheduledMs === null ? null : seq.scheduledMs - seq.arrivedMs,
      e2eMs: this.now() - seq.arrivedMs,
    };
  }

  private remove(seq: Sequence): void {
    seq.state = "finished";
    seq.constraint?.dispose();
    if (seq.constraintId !== 0) this.model.closeConstraint?.(seq.constraintId);
    this.byId.delete(seq.requestId);
    let i = this.running.indexOf(seq);
    if (i >= 0) this.running.splice(i, 1);
    i = this.waiting.indexOf(seq);
    if (i >= 0) this.waiting.splice(i, 1);
  }

  private releaseBlocks(seq: Sequence): void {
    this.giveBack(seq, seq.blockTable);
    seq.blockTable = [];
    seq.numComputed = 0;
  }

  /** Returns seq's references on `ids` now, or, while seq's forward is in flight, once it settles. */
  private giveBack(seq: Sequence, ids: readonly number[]): void {
    const step = seq.inFlightStep;
    if (step === null) this.pool.releaseAll(ids);
    else for (let i = 0; i < ids.length; i++) step.deferred.push(ids[i]!);
  }

  /**
   * Makes seq's block table cover `upTo` positions, preempting the newest running
   * sequences when the pool is short. False when seq itself had to be preempted.
   */
  private reserve(seq: Sequence, upTo: number): boolean {
    for (;;) {
      if (this.grow(seq, upTo)) return true;
      const need = Math.ceil(upTo / this.pool.shape.blockTokens) - seq.blockTable.length;
      const victim = this.running[this.running.length - 1]!;
      if (victim === seq && this.running.length === 1) {
        // Alone and still short: the pool (less pending handles) cannot hold this sequence.
        // An error, not "length": a client must not take a cut-off stream for a finished one.
        this.finish(seq, "error", `out of KV blocks: ${upTo} tokens need ${need} more blocks, ${this.pool.available} of ${this.pool.total} available`);
        return false;
      }
      this.preempt(victim);
      if (victim === seq) return false;
    }
  }

  /** Makes seq's block table cover `upTo` positions from free blocks, preempting nothing; false (nothing taken) when the pool is short. */
  private grow(seq: Sequence, upTo: number): boolean {
    const need = Math.ceil(upTo / this.pool.shape.blockTokens) - seq.blockTable.length;
    if (need <= 0) return true;
    const ids = this.pool.allocate(need);
    if (ids === null) return false;
    seq.blockTable.push(...ids);
    return true;
  }

  private preempt(seq: Sequence): void {
    this.releaseBlocks(seq);
    seq.preemptions++;
    this.stats.preemptions++;
    this.running.splice(this.running.indexOf(seq), 1);
    seq.state = "waiting";
    this.waiting.unshift(seq);
  }

  /** Takes references on the cached blocks that start seq's tokens; always leaves one token to compute. */
  private takePrefixHits(seq: Sequence, B: number): void {
    seq.hashUpTo(seq.tokens.length, B);
    const maxHits = Math.floor((seq.tokens.length - 1) / B);
    for (let b = 0; b < maxHits; b++) {
      const id = this.pool.lookup(seq.hashes[b]!);
      if (id < 0) break;
      this.pool.acquire(id);
      seq.blockTable.push(id);
    }
    seq.numComputed = seq.blockTable.length * B;
  }

  /** Sets fills and names newly completed full blocks for positions from..numComputed. */
  private markComputed(seq: Sequence, from: number, B: number): void {
    const last = Math.ceil(seq.numComputed / B) - 1;
    for (let b = Math.floor(from / B); b <= last; b++) {
      this.pool.setFill(seq.blockTable[b]!, Math.min(B, seq.numComputed - b * B));
    }
    seq.hashUpTo(seq.numComputed, B);
    const full = Math.floor(seq.numComputed / B);
    for (let b = Math.floor(from / B); b < full; b++) {
      const id = seq.blockTable[b]!;
      if (this.pool.hashOf(id) === 0n) this.pool.register(id, seq.hashes[b]!);
    }
  }
}
