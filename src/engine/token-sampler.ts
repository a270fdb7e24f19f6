import {
  applyTokenBitmask,
  choiceSeed,
  LogitsError,
  maskStops,
  processLogits,
  sample,
  stream,
  SAMPLE_STREAM,
  tokenLogprobs,
  type TokenLogprobs,
} from "../rng/index.ts";
import { LogitsRows } from "../model/index.ts";
import type { ModelPort, RowSampling } from "./model-port.ts";
import type { Sequence } from "./sequence.ts";

/** Ids of the model thread's matchers (ModelPort.openConstraint), one per constrained sequence. */
let nextConstraintId = 1;

/**
 * Who samples each token and how: the model itself (a row's RowSampling) when that gives the
 * token this thread would, else this thread from the row's logits, after the request's logits
 * processing, min_tokens mask and structured output.
 *
 * Invariant: exactly one draw of the request's stream per sampled token, none when greedy,
 * whichever side samples it (the model draws from a copy of the stream; `next` takes the same
 * draw here), and a constrained sequence's matcher takes every token it emits.
 */
export class TokenSampler {
  /** The logprobs of the token `next` returned last, when its request asks for them. */
  logprobs: TokenLogprobs | undefined = undefined;
  /** Row views of each logits buffer the model wrote (a model thread's slots rotate several). */
  private readonly rows: LogitsRows;
  /** Scratch for one sequence's processed logits (penalties, bias, min_tokens). */
  private processed = new Float32Array(0);

  constructor(
    private readonly model: ModelPort,
    private readonly eos: ReadonlySet<number>,
  ) {
    this.rows = new LogitsRows(model.vocabSize);
  }

  isStop(seq: Sequence, token: number): boolean {
    return (!seq.sampling.ignoreEos && this.eos.has(token)) || seq.sampling.stopTokenIds.includes(token);
  }

  /**
   * How the model samples seq's row in a step `ahead` tokens on, or null when it does not: it
   * may when the step samples the row (`samples`) and next would sample the raw logits with the
   * request's stream: no logits processing, no min_tokens mask, one choice (the `ahead` tokens
   * are appended before this one: the mask counts them); a structured output when the model can
   * mask it (openConstraint), from a step whose every earlier output token is known (so its
   * matcher there can be built with them).
   */
  rowFor(seq: Sequence, samples: boolean, ahead: number): RowSampling | null {
    const m = this.model;
    if (m.pipelineDepth === undefined || !samples) return null;
    const s = seq.sampling;
    const constrained = seq.constraint === null || (m.openConstraint !== undefined && (seq.constraintId !== 0 || ahead === 0));
    if (seq.processing !== null || !constrained || seq.prefillChoices !== 1 || seq.outputCount + ahead < (s.minTokens ?? 0)) return null;
    if (seq.constraint && seq.constraintId === 0) {
      // Its first row the model samples (ahead is 0: every output token is known): the model
      // thread builds its own matcher, with the output so far taken.
      seq.constraintId = nextConstraintId++;
      m.openConstraint!(seq.constraintId, seq.constraint, seq.tokens.slice(seq.promptLen));
    }
    return seq.rowSampling(ahead);
  }

  /**
   * seq's next token from row `row` of `logits`: `sampled` >= 0 is the one the model sampled
   * already (rowFor said it may), read here for logprobs and the stream's draw alone; else
   * sampled here from a processed copy (the model's logits stay intact for logprobs). Choices
   * 1..n-1 of a prefill are sampled beside it (seq.moreChoices). Throws LogitsError when the
   * logits or the grammar leave this sequence no token.
   */
  next(seq: Sequence, logits: Float32Array, row: number, sampled: number): number {
    const raw = this.rows.row(logits, row);
    const token = sampled >= 0 ? this.takeModelToken(seq, sampled) : this.sampleHere(seq, raw);
    const k = seq.sampling.topLogprobs;
    this.logprobs = k === undefined ? undefined : tokenLogprobs(raw, token, k);
    return token;
  }

  /** The model drew its one uniform from a copy of the stream and masked with its own matcher: this side takes the same draw and the same token. */
  private takeModelToken(seq: Sequence, sampled: number): number {
    if (seq.rng) {
      seq.rng.uniformF64();
      seq.draws++;
    }
    if (seq.constraint && !seq.constraint.accept(sampled))
      throw new LogitsError(`structured output: the grammar refused token ${sampled} (sampled on the model thread)`, false);
    return sampled;
  }

  /** Samples from a processed copy of `raw`, and a prefill's other choices beside it. */
  private sampleHere(seq: Sequence, raw: Float32Array): number {
    const s = seq.sampling;
    const logits = this.processedFor(seq, raw);
    const token = sample(logits, s, seq.rng);
    if (seq.rng) seq.draws++;
    if (seq.constraint && !seq.constraint.accept(token)) throw new LogitsError(`structured output: the grammar refused token ${token}`, false);
    // One prefill for n choices: the others' first tokens come from the same logits, each
    // from its own stream with the same draw count as choice 0's.
    for (let j = 1; j < seq.prefillChoices; j++) {
      const t = sample(logits, s, seq.rng ? stream(choiceSeed(s.seed, j), SAMPLE_STREAM) : null);
      const logprobs = s.topLogprobs === undefined ? undefined : tokenLogprobs(raw, t, s.topLogprobs);
      seq.moreChoices.push({ token: t, logprobs, finished: this.isStop(seq, t) || s.maxTokens <= 1 });
    }
    return token;
  }

  /** `raw` as the request asks to sample it (penalties and bias, min_tokens, the grammar's mask): a scratch copy, or raw itself when nothing changes it. */
  private processedFor(seq: Sequence, raw: Float32Array): Float32Array {
    const s = seq.sampling;
    const masked = seq.outputCount < (s.minTokens ?? 0);
    const constraint = seq.constraint;
    if (!seq.processing && !masked && !constraint) return raw;
    if (this.processed.length !== raw.length) this.processed = new Float32Array(raw.length);
    const out = this.processed;
    out.set(raw);
    if (seq.processing) processLogits(out, seq.processing, seq.history!);
    if (masked) {
      if (!s.ignoreEos) maskStops(out, this.eos);
      maskStops(out, s.stopTokenIds);
    }
    if (constraint) {
      constraint.fillMask(seq.mask!);
      // A dead end (min_tokens holding back the only way the grammar can end, say) ends this sequence alone.
      if (applyTokenBitmask(out, seq.mask!) === 0) throw new LogitsError("structured output: no token the grammar allows is possible here", true);
    }
    return out;
  }
}
