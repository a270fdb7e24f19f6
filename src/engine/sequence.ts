import { blockHash } from "../codec/index.ts";
import type { Pcg32 } from "../rng/index.ts";

export interface SamplingParams {
  temperature: number;
  topP: number;
  topK: number;
  seed: bigint;
  maxTokens: number;
  stopTokenIds: readonly number[];
}

export type FinishReason = "stop" | "length" | "cancelled" | "prefilled" | "error";

/** What a prefill-only request hands back: the caller owns one reference on each block. */
export interface PrefillOutput {
  blockIds: number[];
  hashes: bigint[];
  firstToken: number;
  draws: number;
  /** The first token already ended the request (stop token or max_tokens = 1). */
  finished: boolean;
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
  prefill?: PrefillOutput;
}

export type SeqState = "waiting" | "running" | "finished";

/**
 * One request inside the engine. `tokens` is prompt then output; positions
 * 0..numComputed-1 have their K/V in the pool through `blockTable`.
 */
export class Sequence {
  state: SeqState = "waiting";
  readonly tokens: number[];
  numComputed = 0;
  blockTable: number[] = [];
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

  constructor(
    readonly requestId: string,
    promptTokens: readonly number[],
    readonly sampling: SamplingParams,
    readonly rng: Pcg32 | null,
    readonly promptLen: number,
    readonly prefillOnly: boolean,
    readonly onToken: (token: number) => void,
    readonly onFinish: (f: Finish) => void,
  ) {
    this.tokens = [...promptTokens];
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
