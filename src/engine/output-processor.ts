import { LogitsError, type TokenLogprobs } from "../rng/index.ts";
import type { KvCacheManager } from "./kv-cache-manager.ts";
import { type ModelPort, SAMPLE_FAILED } from "./model-port.ts";
import type { Scheduler } from "./scheduler.ts";
import type { Finish, FinishReason, Sequence } from "./sequence.ts";
import type { Step } from "./step.ts";
import type { TokenSampler } from "./token-sampler.ts";

export interface OutputProcessorOptions {
  kv: KvCacheManager;
  scheduler: Scheduler;
  sampler: TokenSampler;
  model: ModelPort;
  maxModelLen: number;
  now: () => number;
  /** The engine's requests in flight, by id: a request leaves it as it ends. */
  requests: Map<string, Sequence>;
  /** Where prefill and decode tokens are counted (the engine's stats). */
  stats: { prefillTokens: number; decodeTokens: number };
}

/**
 * What a settled step leaves behind (vLLM's output processor): positions computed, tokens
 * sampled and emitted, and requests ended (a stop, max_tokens, the context, a prefill handed
 * off, a cancel or an error).
 *
 * Invariant: a request ends exactly once (its onFinish), leaving the queues, its matchers
 * closed, and every block it held given back (or, a prefill, handed to its caller) through the
 * KvCacheManager, which keeps them referenced while a step in flight still holds them.
 */
export class OutputProcessor {
  private readonly kv: KvCacheManager;
  private readonly scheduler: Scheduler;
  private readonly sampler: TokenSampler;
  private readonly model: ModelPort;
  private readonly maxModelLen: number;
  private readonly now: () => number;
  private readonly requests: Map<string, Sequence>;
  private readonly stats: { prefillTokens: number; decodeTokens: number };

  constructor(opts: OutputProcessorOptions) {
    this.kv = opts.kv;
    this.scheduler = opts.scheduler;
    this.sampler = opts.sampler;
    this.model = opts.model;
    this.maxModelLen = opts.maxModelLen;
    this.now = opts.now;
    this.requests = opts.requests;
    this.stats = opts.stats;
  }

  /**
   * After the forward: the one place computed positions are recorded (fills, and hashes of
   * newly full blocks registered for prefix hits), then sampling where a chunk reached the end
   * of its tokens. A sequence cancelled meanwhile is skipped. Logits one sequence cannot be
   * sampled from (LogitsError) end that sequence alone, with the error; the step goes on for
   * the others, whose tokens are what they would have been without it.
   */
  postprocess(step: Step): void {
    const B = this.kv.blockTokens;
    for (let i = 0; i < step.seqs.length; i++) {
      const seq = step.seqs[i]!;
      const n = step.counts[i]!;
      if (seq.state !== "running") continue;
      if (seq.numComputed >= seq.promptLen) this.stats.decodeTokens += n;
      else this.stats.prefillTokens += n;
      const from = seq.numComputed;
      seq.numComputed += n;
      seq.hashUpTo(seq.numComputed, B);
      this.kv.markComputed(seq.kv, seq.hashes, from, seq.numComputed);
      if (seq.numComputed < seq.tokens.length) continue;
      // The model thread could not sample the row (SAMPLE_FAILED): sampled here from the same raw logits, it fails the same way.
      const sampled = step.sampling[i] ? step.sampled![i]! : -1;
      try {
        const token = this.sampler.next(seq, step.logits, i, sampled === SAMPLE_FAILED ? -1 : sampled);
        this.appendToken(seq, token, true, this.sampler.logprobs);
      } catch (e) {
        if (!(e instanceof LogitsError)) throw e;
        // Its blocks go back once every step holding it settled; a step planned ahead with its
        // row computes a stand-in token there, and skips it when it settles.
        this.finish(seq, "error", e.message, e.byRequest ? "request" : "model");
      }
    }
  }

  /** Records a sampled token; false when it finished the sequence. */
  appendToken(seq: Sequence, token: number, emit: boolean, logprobs?: TokenLogprobs): boolean {
    seq.tokens.push(token);
    seq.outputCount++;
    seq.history?.add(token);
    if (emit) seq.onToken(token, logprobs);
    const stopped = this.sampler.isStop(seq, token);
    if (seq.prefillOnly) {
      this.finishPrefill(seq, token, stopped || seq.outputCount >= seq.sampling.maxTokens, logprobs);
      return false;
    }
    if (stopped) this.finish(seq, "stop");
    else if (seq.outputCount >= seq.sampling.maxTokens || seq.tokens.length >= this.maxModelLen) this.finish(seq, "length");
    return seq.state !== "finished";
  }

  /** A prefill-only request's end: its prompt's blocks go to the caller, unless every choice ended already. */
  private finishPrefill(seq: Sequence, firstToken: number, finished: boolean, firstLogprobs?: TokenLogprobs): void {
    const hashes = seq.hashes.slice(0, Math.floor(seq.promptLen / this.kv.blockTokens));
    const choices = [{ token: firstToken, logprobs: firstLogprobs, finished }, ...seq.moreChoices];
    const all = choices.every((c) => c.finished);
    const blockIds = all ? [] : this.kv.handOff(seq.kv, seq.promptLen);
    if (all) this.kv.free(seq.kv);
    this.remove(seq);
    seq.onFinish({
      ...this.summary(seq, all ? "stop" : "prefilled"),
      prefill: { blockIds, hashes, firstToken, draws: seq.draws, finished: all, firstLogprobs, choices },
    });
  }

  finish(seq: Sequence, reason: FinishReason, error?: string, errorKind?: Finish["errorKind"]): void {
    if (seq.state === "finished") return;
    this.scheduler.freeBlocks(seq);
    this.remove(seq);
    seq.onFinish({ ...this.summary(seq, reason), error, ...(errorKind ? { errorKind } : {}) });
  }

  summary(seq: Sequence, reason: FinishReason): Finish {
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
    this.scheduler.remove(seq);
    seq.constraint?.dispose();
    if (seq.constraintId !== 0) this.model.closeConstraint?.(seq.constraintId);
    this.requests.delete(seq.requestId);
  }
}
