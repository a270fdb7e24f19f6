import { blockHash } from "../codec/index.ts";
import { compileLogits, isIdentity, TokenHistory, type CompiledLogits, type LogitsConfig, type Pcg32, type TokenLogprobs } from "../rng/index.ts";
import type { TokenMatcher } from "../grammar/index.ts";
import type { KvBlocks } from "./kv-cache-manager.ts";
import type { RowSampling, SeqChunk } from "./model-port.ts";

export interface SamplingParams {
  temperature: number;
  topP: number;
  topK: number;
  seed: bigint;
  maxTokens: number;
  stopTokenIds: readonly number[];
  /** vLLM's penalties and OpenAI's logit_bias; absent = off (see rng/logits-processor.ts). */
  presencePenalty?: number;
  frequencyPenalty?: number;
  repetitionPenalty?: number;
  logitBias?: ReadonlyMap<number, number>;
  /** EOS and stop_token_ids cannot be sampled before this many output tokens. */
  minTokens?: number;
  /** EOS does not end the request (stop_token_ids still do). */
  ignoreEos?: boolean;
  /** Report each token's logprob and this many alternatives; absent = no logprobs. */
  topLogprobs?: number;
}

export type FinishReason = "stop" | "length" | "cancelled" | "prefilled" | "error";

/** One choice's first token, sampled by the prefill engine. */
export interface FirstToken {
  token: number;
  logprobs?: TokenLogprobs;
  /** It ended this choice (a stop token, or max_tokens = 1). */
  finished: boolean;
}

/** What a prefill-only request hands back: the caller owns one reference on each block. */
export interface PrefillOutput {
  blockIds: number[];
  hashes: bigint[];
  firstToken: number;
  draws: number;
  /** Every choice ended with its first token: no blocks are handed back. */
  finished: boolean;
  /** The first token's logprobs, when the request asked for them. */
  firstLogprobs?: TokenLogprobs;
  /** Choice j's first token (j = 0 is firstToken), drawn from stream(seed + j): one prefill for n choices. */
  choices: FirstToken[];
}

export interface Finish {
  reason: FinishReason;
  promptTokens: number;
  outputTokens: number[];
  prefixHitTokens: number;
  preemptions: number;
  /** The request continued from another engine's prefill (its first token came with it). */
  resumed: boolean;
  /** Milliseconds from submit to first being scheduled; null when it never was. */
  queueMs: number | null;
  /** Milliseconds from submit to this finish. */
  e2eMs: number;
  error?: string;
  /**
   * Reason "error" from a sampling step that failed for this sequence alone (its batch went
   * on): "request" when its own settings left no token to sample, "model" when the model's
   * logits for it were NaN.
   */
  errorKind?: "request" | "model";
  prefill?: PrefillOutput;
}

export type SeqState = "waiting" | "running" | "finished";

/** What a sequence is made from (Engine.submit). */
export interface SequenceInit {
  requestId: string;
  promptTokens: readonly number[];
  sampling: SamplingParams;
  /** The request's sample stream; null when greedy. */
  rng: Pcg32 | null;
  prefillOnly: boolean;
  /** Prefill only: first tokens to sample from the prompt's logits, one per choice. */
  prefillChoices: number;
  onToken: (token: number, logprobs?: TokenLogprobs) => void;
  onFinish: (f: Finish) => void;
  vocabSize: number;
  /** Its table of blocks, from the engine's KvCacheManager (empty, or a resumed prompt's). */
  kv: KvBlocks;
  /** A structured output's matcher, or null. */
  constraint: TokenMatcher | null;
}

/**
 * One request inside the engine. `tokens` is prompt then output; positions
 * 0..numComputed-1 have their K/V in the pool through the blocks of `kv`.
 */
export class Sequence {
  state: SeqState = "waiting";
  readonly requestId: string;
  readonly tokens: number[];
  readonly promptLen: number;
  readonly sampling: SamplingParams;
  readonly rng: Pcg32 | null;
  readonly prefillOnly: boolean;
  readonly prefillChoices: number;
  readonly onToken: (token: number, logprobs?: TokenLogprobs) => void;
  readonly onFinish: (f: Finish) => void;
  numComputed = 0;
  /** Its blocks (the KvCacheManager's to change). */
  readonly kv: KvBlocks;
  /** Hashes of the full blocks of `tokens` computed so far, chained from 0. */
  readonly hashes: bigint[] = [];
  outputCount = 0;
  prefixHitTokens = 0;
  preemptions = 0;
  draws = 0;
  resumed = false;
  /** Engine clock readings: when submitted, and when first scheduled (null until then). */
  arrivedMs = 0;
  scheduledMs: number | null = null;
  /** How this request changes the logits before sampling; null when it does not. */
  readonly processing: CompiledLogits | null;
  /** Output token counts (and prompt tokens) for the penalties; null without processing. */
  readonly history: TokenHistory | null;
  /** Prefill only: the first tokens of choices 1..n-1, sampled beside choice 0's. */
  moreChoices: FirstToken[] = [];
  /** A structured output's matcher (disposed when the sequence ends), and its mask's scratch; null when unconstrained. */
  readonly constraint: TokenMatcher | null;
  readonly mask: Int32Array | null;
  /** The id of its matcher on the model thread (ModelPort.openConstraint), 0 until one is opened. */
  constraintId = 0;
  /**
   * Its chunk and row sampling of the step being planned, reused step after step so a decode
   * allocates nothing per token: the model reads both while the step is posted (ModelPort), so
   * the next step may overwrite them while this one still runs.
   */
  private readonly chunk: SeqChunk & { tokens: number[] } = { blockTable: [], startPos: 0, tokens: [] };
  private readonly oneToken: number[] = [0];
  private readonly row: RowSampling;
  /** The stream as a step posted ahead will find it (copied into, never reallocated). */
  private aheadRng: Pcg32 | null = null;

  constructor(init: SequenceInit) {
    this.requestId = init.requestId;
    this.tokens = [...init.promptTokens];
    this.promptLen = init.promptTokens.length;
    this.sampling = init.sampling;
    this.rng = init.rng;
    this.prefillOnly = init.prefillOnly;
    this.prefillChoices = init.prefillChoices;
    this.onToken = init.onToken;
    this.onFinish = init.onFinish;
    this.kv = init.kv;
    this.constraint = init.constraint;
    this.mask = init.constraint ? new Int32Array(init.constraint.words) : null;
    const processing = logitsConfigOf(init.sampling);
    this.processing = isIdentity(processing) ? null : compileLogits(processing);
    this.history = this.processing ? new TokenHistory(init.promptTokens, processing.repetitionPenalty !== 1, init.vocabSize) : null;
    this.row = { cfg: init.sampling, rng: null, constraint: 0, outputs: 0 };
  }

  /**
   * Its chunk of a step: `n` tokens from `startPos` (`token` stands for a one-token chunk's, e.g.
   * prevToken(r)). A one-token chunk reuses its array; a prefill chunk (not per token) is a slice.
   */
  chunkAt(startPos: number, n: number, token = this.tokens[startPos]!): SeqChunk {
    const c = this.chunk;
    c.blockTable = this.kv.ids;
    c.startPos = startPos;
    if (n === 1) {
      this.oneToken[0] = token;
      c.tokens = this.oneToken;
    } else c.tokens = this.tokens.slice(startPos, startPos + n);
    return c;
  }

  /**
   * How the model samples its row in a step `ahead` tokens on: its stream after that many draws,
   * one per token; with a structured output, its matcher on the model thread and the output count.
   */
  rowSampling(ahead: number): RowSampling {
    this.row.constraint = this.constraintId;
    this.row.outputs = this.outputCount + ahead;
    const rng = this.rng;
    if (rng === null || ahead === 0) this.row.rng = rng;
    else {
      this.aheadRng ??= rng.clone();
      this.row.rng = this.aheadRng.copyFrom(rng);
      for (let i = 0; i < ahead; i++) this.row.rng.uniformF64();
    }
    return this.row;
  }

  /** Extends `hashes` to every full block of tokens[0..upTo). */
  hashUpTo(upTo: number, blockTokens: number): void {
    for (let b = this.hashes.length; (b + 1) * blockTokens <= upTo; b++) {
      const parent = b === 0 ? 0n : this.hashes[b - 1]!;
      this.hashes.push(blockHash(parent, this.tokens.slice(b * blockTokens, (b + 1) * blockTokens)));
    }
  }

  get outputTokens(): number[] {
    return this.tokens.slice(this.promptLen);
  }
}

export function logitsConfigOf(s: SamplingParams): LogitsConfig {
  return {
    presencePenalty: s.presencePenalty ?? 0,
    frequencyPenalty: s.frequencyPenalty ?? 0,
    repetitionPenalty: s.repetitionPenalty ?? 1,
    logitBias: s.logitBias ?? new Map(),
  };
}
