import assert from "node:assert";
import type { TokenMatcher } from "../grammar/index.ts";
import { resumeRng, stream, SAMPLE_STREAM, type TokenLogprobs } from "../rng/index.ts";
import type { KvPool } from "../pool/index.ts";
import { KvCacheManager } from "./kv-cache-manager.ts";
import { type ModelPort, prevToken } from "./model-port.ts";
import { Scheduler } from "./scheduler.ts";
import { Sequence, type Finish, type FinishReason, type SamplingParams } from "./sequence.ts";
import type { Step } from "./step.ts";
import { StepPipeline } from "./step-pipeline.ts";
import { TokenSampler } from "./token-sampler.ts";
import { OutputProcessor } from "./output-processor.ts";

export interface EngineOptions {
  model: ModelPort;
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
   * Steps a pipelined model (ModelPort.pipelineDepth) may hold in flight: the one running and
   * those posted after it (default 3, at most the model's pipelineDepth; 1 = none ahead). A decode
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
 * Continuous batching over a paged pool, one step at a time: the Scheduler picks the rows
 * (over the KvCacheManager's blocks), the StepPipeline runs them on the model (and, a pipelined
 * model, the decodes planned ahead while one runs), and the OutputProcessor records what each
 * settled step computed, samples (TokenSampler) and ends requests.
 *
 * Invariant: one run of steps at a time (a step is under way, or one is scheduled, never two),
 * and while any request waits or runs another is scheduled once it ends; a run that fails ends
 * every request still queued or running, so none is stranded with its blocks.
 */
export class Engine {
  readonly pool: KvPool;
  readonly model: ModelPort;
  readonly maxModelLen: number;
  readonly stats: EngineStats = { steps: 0, prefillTokens: 0, decodeTokens: 0, prefixHitTokens: 0, preemptions: 0 };
  private readonly kv: KvCacheManager;
  private readonly scheduler: Scheduler;
  private readonly pipeline: StepPipeline;
  private readonly sampler: TokenSampler;
  private readonly output: OutputProcessor;
  private readonly byId = new Map<string, Sequence>();
  private scheduled = false;
  /** A step is under way (its forward may be running on another thread). */
  private stepping = false;
  private draining = false;
  private readonly now: () => number;
  private readonly finishListeners: ((f: Finish) => void)[] = [];
  private readonly loop = (): void => void this.loopOnce();

  constructor(opts: EngineOptions) {
    assert(opts.maxBatchTokens >= 1);
    const model = opts.model;
    this.model = model;
    this.pool = opts.pool;
    this.maxModelLen = opts.maxModelLen;
    this.now = opts.now ?? (() => performance.now());
    this.kv = new KvCacheManager(opts.pool);
    this.sampler = new TokenSampler(model, new Set(opts.eosTokenIds ?? []));
    this.scheduler = new Scheduler({
      kv: this.kv,
      maxBatchTokens: opts.maxBatchTokens,
      maxRunning: opts.maxRunning ?? 64,
      maxModelLen: opts.maxModelLen,
      now: this.now,
      fail: (seq, error) => this.output.finish(seq, "error", error),
      stats: this.stats,
    });
    this.output = new OutputProcessor({
      kv: this.kv,
      scheduler: this.scheduler,
      sampler: this.sampler,
      model,
      maxModelLen: opts.maxModelLen,
      now: this.now,
      requests: this.byId,
      stats: this.stats,
    });
    const depth = model.pipelineDepth === undefined ? 1 : Math.max(1, Math.min(opts.pipelineDepth ?? 3, model.pipelineDepth));
    this.pipeline = new StepPipeline({
      model,
      pool: opts.pool,
      kv: this.kv,
      depth,
      stats: this.stats,
      planAhead: (queue) => this.planAhead(queue),
      postprocess: (step) => this.output.postprocess(step),
    });
  }

  get queueDepth(): number {
    return this.scheduler.waiting.length;
  }
  get runningCount(): number {
    return this.scheduler.running.length;
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
    return new Promise<Finish>((resolve) => {
      const seq = this.sequenceOf(req, (f) => {
        resolve(f);
        for (const listen of this.finishListeners) listen(f);
      });
      const refused = this.refusal(seq, req);
      if (refused !== null) {
        seq.constraint?.dispose();
        this.kv.free(seq.kv);
        seq.onFinish({ ...this.output.summary(seq, "error"), error: refused });
        return;
      }
      this.byId.set(seq.requestId, seq);
      if (req.resume) this.resume(seq, req.resume);
      else {
        this.scheduler.enqueue(seq);
        this.kick();
      }
    });
  }

  /** Cancels a request wherever it is and frees its blocks; false when unknown. */
  cancel(requestId: string, reason: FinishReason = "cancelled", error?: string): boolean {
    const seq = this.byId.get(requestId);
    if (!seq) return false;
    this.output.finish(seq, reason, error);
    return true;
  }

  /** Stops admitting new requests; resolves with the count still in flight at the deadline. */
  async drain(deadlineMs: number): Promise<number> {
    this.draining = true;
    const end = Date.now() + Math.max(0, deadlineMs);
    while (this.byId.size > 0 && Date.now() < end) await Bun.sleep(Math.min(10, end - Date.now()));
    return this.byId.size;
  }

  private sequenceOf(req: EngineRequest, onFinish: (f: Finish) => void): Sequence {
    const s = req.sampling;
    const r = req.resume;
    const seq = new Sequence({
      requestId: req.requestId,
      promptTokens: req.promptTokens,
      sampling: s,
      rng: s.temperature <= 0 ? null : r ? resumeRng(s.seed, r.draws) : stream(s.seed, SAMPLE_STREAM),
      prefillOnly: req.prefillOnly ?? false,
      prefillChoices: req.choices ?? 1,
      onToken: req.onToken ?? (() => {}),
      onFinish,
      vocabSize: this.model.vocabSize,
      kv: r ? this.kv.adopt(r.blockIds) : this.kv.open(),
      constraint: req.constraint ?? null,
    });
    seq.arrivedMs = this.now();
    return seq;
  }

  /** Why the request is refused before any work (its blocks, a resume's, go back), or null. */
  private refusal(seq: Sequence, req: EngineRequest): string | null {
    const r = req.resume;
    if (r)
      return seq.constraint && !seq.constraint.accept(r.firstToken) ? `the first token ${r.firstToken} does not fit the request's structured output` : null;
    return this.kv.blocksFor(seq.promptLen + 1) > this.kv.total ? `prompt of ${seq.promptLen} tokens does not fit a pool of ${this.kv.total} blocks` : null;
  }

  /** A request another engine prefilled: its prompt is computed in the blocks adopted, its first token is the next input. */
  private resume(seq: Sequence, r: NonNullable<EngineRequest["resume"]>): void {
    assert(r.blockIds.length === this.kv.blocksFor(seq.promptLen), "resume blocks do not cover the prompt");
    seq.numComputed = seq.promptLen;
    seq.hashUpTo(seq.promptLen, this.kv.blockTokens);
    seq.draws = r.draws;
    seq.resumed = true;
    this.scheduler.admitComputed(seq);
    // The first token was sampled and emitted elsewhere; it is only the next input here.
    if (this.output.appendToken(seq, r.firstToken, false)) this.kick();
  }

  /**
   * References a resumed prompt's blocks once more, for one more sequence of the same prompt
   * (KvCacheManager.sharePrompt). Null when no block is free.
   */
  sharePrompt(blockIds: readonly number[], promptLen: number): number[] | null {
    return this.kv.sharePrompt(blockIds, promptLen);
  }

  /**
   * One step: schedule, run (with the steps a pipelined model takes ahead while it runs), and
   * postprocess each as it settles; exposed for tests that drive the loop by hand.
   */
  async step(): Promise<void> {
    const first = this.pipeline.take(0);
    if (!this.scheduler.plan(first)) return this.pipeline.recycle(first);
    this.prepare(first);
    await this.pipeline.run(first);
  }

  private kick(): void {
    if (this.scheduled || this.stepping) return;
    this.scheduled = true;
    setImmediate(this.loop);
  }

  private async loopOnce(): Promise<void> {
    this.scheduled = false;
    if (this.scheduler.idle) return;
    this.stepping = true;
    try {
      await this.step();
    } catch (e) {
      // A model failure must not strand requests or their blocks.
      const msg = e instanceof Error ? e.message : String(e);
      for (const seq of [...this.scheduler.running, ...this.scheduler.waiting]) this.output.finish(seq, "error", msg);
    } finally {
      this.stepping = false;
    }
    if (!this.scheduler.idle) this.kick();
  }

  /** The pipeline's next step while `queue` runs (Scheduler.planAhead), or null. */
  private planAhead(queue: readonly Step[]): Step | null {
    const step = this.pipeline.take(queue.length);
    if (this.scheduler.planAhead(queue, step)) {
      this.prepare(step);
      return step;
    }
    this.pipeline.recycle(step);
    return null;
  }

  /**
   * The model's inputs for the rows the scheduler picked: each row's chunk, and whether the model
   * samples it. A row of a step planned ahead is one token the model samples in the step before
   * (prevToken); any other computes its next tokens from numComputed and samples when they are its last.
   */
  private prepare(step: Step): void {
    const ahead = step.ahead;
    for (let r = 0; r < step.rows; r++) {
      const seq = step.seqs[r]!;
      const n = step.counts[r]!;
      const samples = ahead > 0 || seq.numComputed + n === seq.tokens.length;
      step.chunks[r] = ahead > 0 ? seq.chunkAt(seq.tokens.length + ahead - 1, 1, prevToken(r)) : seq.chunkAt(seq.numComputed, n);
      step.sampling[r] = this.sampler.rowFor(seq, samples, ahead);
    }
    step.seal();
  }
}
