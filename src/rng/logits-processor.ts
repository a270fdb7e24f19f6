/**
 * What a request changes in the logits before `sample` sees them: vLLM's penalties,
 * logit_bias and min_tokens. Processing changes logit values only, never the number of
 * uniform draws `sample` takes, so the hand-off's draw counting (random-stream.md) holds
 * whatever is set here: both engines apply the same processing to the same token history.
 */
export interface LogitsConfig {
  /** [-2, 2]; subtracted once from every token that occurs in the output. */
  presencePenalty: number;
  /** [-2, 2]; subtracted once per occurrence in the output. */
  frequencyPenalty: number;
  /** [1/100, 100], 1 = off; tokens of the prompt or the output: positive logits divided, negative multiplied. */
  repetitionPenalty: number;
  /** token id → bias in [-100, 100], added to the logit. */
  logitBias: ReadonlyMap<number, number>;
}

/**
 * Range limits, as vLLM checks them, and a floor under the repetition penalty that vLLM
 * lacks (it takes any r > 0): a logit divided by r = 1e-300 is +Infinity, and no token can
 * be sampled. With these bounds processing moves a logit by at most ×100 and ±(100 + 2 + 2 ×
 * count), so a model's finite logits (real ones stay far below 1e30) stay finite; what still
 * is not (a NaN from the model) ends that request alone (LogitsError, the engine).
 */
const PENALTY_LIMIT = 2;
const LOGIT_BIAS_LIMIT = 100;
const MAX_REPETITION_PENALTY = 100;
const MIN_REPETITION_PENALTY = 1 / MAX_REPETITION_PENALTY;

/** Returns why `cfg` is out of range, or null when it is valid. */
export function validateLogits(cfg: LogitsConfig, vocab: number): string | null {
  for (const [name, v] of [
    ["presence_penalty", cfg.presencePenalty],
    ["frequency_penalty", cfg.frequencyPenalty],
  ] as const) {
    if (!Number.isFinite(v) || Math.abs(v) > PENALTY_LIMIT) return `${name} must be in [-${PENALTY_LIMIT}, ${PENALTY_LIMIT}], got ${v}`;
  }
  const r = cfg.repetitionPenalty;
  if (!Number.isFinite(r) || r < MIN_REPETITION_PENALTY || r > MAX_REPETITION_PENALTY)
    return `repetition_penalty must be in [${MIN_REPETITION_PENALTY}, ${MAX_REPETITION_PENALTY}], got ${r}`;
  for (const [id, b] of cfg.logitBias) {
    if (!Number.isInteger(id) || id < 0 || id >= vocab) return `logit_bias token ${id} outside the vocabulary 0..${vocab - 1}`;
    if (!Number.isFinite(b) || Math.abs(b) > LOGIT_BIAS_LIMIT) return `logit_bias[${id}] must be in [-${LOGIT_BIAS_LIMIT}, ${LOGIT_BIAS_LIMIT}], got ${b}`;
  }
  return null;
}

/** True when `cfg` changes nothing: the engine then samples the model's logits in place. */
export function isIdentity(cfg: LogitsConfig): boolean {
  return cfg.presencePenalty === 0 && cfg.frequencyPenalty === 0 && cfg.repetitionPenalty === 1 && cfg.logitBias.size === 0;
}

/**
 * The token history processing depends on: how often each token occurs in the output,
 * and (for the repetition penalty) which tokens occur in the prompt. Kept per sequence
 * and updated once per token; counts are indexed by token id and the distinct ids kept
 * in order, so processing costs O(distinct tokens) and allocates nothing per token.
 */
export class TokenHistory {
  /** Output occurrences by token id. */
  readonly counts: Uint32Array;
  /** Distinct output tokens, in first-occurrence order. */
  readonly outputIds: number[] = [];
  /** 1 for a token of the prompt (only when the repetition penalty is on). */
  readonly inPrompt: Uint8Array;
  /** Distinct prompt tokens. */
  readonly promptIds: number[] = [];

  constructor(prompt: readonly number[], trackPrompt: boolean, vocab: number) {
    this.counts = new Uint32Array(vocab);
    this.inPrompt = new Uint8Array(trackPrompt ? vocab : 0);
    if (!trackPrompt) return;
    for (const t of prompt) {
      if (this.inPrompt[t] === 0) this.promptIds.push(t);
      this.inPrompt[t] = 1;
    }
  }

  add(token: number): void {
    if (token >= this.counts.length) return;
    if (this.counts[token] === 0) this.outputIds.push(token);
    this.counts[token]!++;
  }
}

/** LogitsConfig with logit_bias as parallel arrays, for a loop that allocates nothing. */
export interface CompiledLogits {
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
  biasIds: Uint32Array;
  biasValues: Float64Array;
}

export function compileLogits(cfg: LogitsConfig): CompiledLogits {
  return {
    presencePenalty: cfg.presencePenalty,
    frequencyPenalty: cfg.frequencyPenalty,
    repetitionPenalty: cfg.repetitionPenalty,
    biasIds: Uint32Array.from(cfg.logitBias.keys()),
    biasValues: Float64Array.from(cfg.logitBias.values()),
  };
}

/**
 * Applies, in vLLM's order, logit_bias, then the repetition penalty (over prompt and
 * output tokens), then the frequency and presence penalties (over output tokens), in place.
 */
export function processLogits(logits: Float32Array, cfg: CompiledLogits, h: TokenHistory): void {
  for (let i = 0; i < cfg.biasIds.length; i++) logits[cfg.biasIds[i]!] = logits[cfg.biasIds[i]!]! + cfg.biasValues[i]!;
  const r = cfg.repetitionPenalty;
  if (r !== 1) {
    for (const id of h.promptIds) logits[id] = penalize(logits[id]!, r);
    for (const id of h.outputIds) if (h.inPrompt[id] !== 1) logits[id] = penalize(logits[id]!, r);
  }
  const f = cfg.frequencyPenalty;
  const p = cfg.presencePenalty;
  if (f !== 0 || p !== 0) {
    for (const id of h.outputIds) logits[id] = logits[id]! - f * h.counts[id]! - p;
  }
}

function penalize(l: number, r: number): number {
  return l > 0 ? l / r : l * r;
}

/** min_tokens: the tokens that would end the request cannot be sampled yet. */
export function maskStops(logits: Float32Array, stops: Iterable<number>): void {
  for (const id of stops) if (id < logits.length) logits[id] = -Infinity;
}

/**
 * A structured output's constraint: token i stays only when bit (i & 31) of mask[i >> 5] is
 * set; the others become -Infinity. Returns how many tokens stay finite (0: the grammar
 * allows nothing the logits allow: a dead end, which ends that sequence). Like the rest of
 * processing it changes logits only, never the number of draws a token takes.
 */
export function applyTokenBitmask(logits: Float32Array, mask: Int32Array): number {
  const n = logits.length;
  let finite = 0;
  for (let w = 0, base = 0; base < n; w++, base += 32) {
    const bits = mask[w] ?? 0;
    const end = Math.min(32, n - base);
    for (let b = 0; b < end; b++) {
      const i = base + b;
      if ((bits >>> b) & 1) {
        if (logits[i]! > -Infinity) finite++;
      } else logits[i] = -Infinity;
    }
  }
  return finite;
}
