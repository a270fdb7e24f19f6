/**
 * What a request changes in the logits before `sample` sees them: vLLM's penalties,
 * logit_bias and min_tokens. Processing changes logit values only, never the number of
 * uniform draws `sample` takes, so the hand-off's draw counting (pcg32.md) holds
 * whatever is set here: both engines apply the same processing to the same token history.
 */
export interface LogitsConfig {
  /** [-2, 2]; subtracted once from every token that occurs in the output. */
  presencePenalty: number;
  /** [-2, 2]; subtracted once per occurrence in the output. */
  frequencyPenalty: number;
  /** > 0, 1 = off; tokens of the prompt or the output: positive logits divided, negative multiplied. */
  repetitionPenalty: number;
  /** token id → bias in [-100, 100], added to the logit. */
  logitBias: ReadonlyMap<number, number>;
}

export const NO_PROCESSING: LogitsConfig = Object.freeze({
  presencePenalty: 0,
  frequencyPenalty: 0,
  repetitionPenalty: 1,
  logitBias: new Map<number, number>(),
});

/** Range limits, as vLLM checks them. */
export const PENALTY_LIMIT = 2;
export const LOGIT_BIAS_LIMIT = 100;
export const MAX_REPETITION_PENALTY = 100;

/** Returns why `cfg` is out of range, or null when it is valid. */
export function validateLogits(cfg: LogitsConfig, vocab: number): string | null {
  for (const [name, v] of [
    ["presence_penalty", cfg.presencePenalty],
    ["frequency_penalty", cfg.frequencyPenalty],
  ] as const) {
    if (!Number.isFinite(v) || Math.abs(v) > PENALTY_LIMIT) return `${name} must be in [-${PENALTY_LIMIT}, ${PENALTY_LIMIT}], got ${v}`;
  }
  const r = cfg.repetitionPenalty;
  if (!Number.isFinite(r) || r <= 0 || r > MAX_REPETITION_PENALTY) return `repetition_penalty must be in (0, ${MAX_REPETITION_PENALTY}], got ${r}`;
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
 * and updated once per token, so processing costs O(distinct tokens), not O(vocab).
 */
export class TokenHistory {
  readonly outputCounts = new Map<number, number>();
  readonly promptTokens: ReadonlySet<number>;

  constructor(prompt: readonly number[], trackPrompt: boolean) {
    this.promptTokens = trackPrompt ? new Set(prompt) : new Set();
  }

  add(token: number): void {
    this.outputCounts.set(token, (this.outputCounts.get(token) ?? 0) + 1);
  }
}

/**
 * Applies, in vLLM's order, logit_bias, then the repetition penalty (over prompt and
 * output tokens), then the frequency and presence penalties (over output tokens), in place.
 */
export function processLogits(logits: Float32Array, cfg: LogitsConfig, h: TokenHistory): void {
  for (const [id, b] of cfg.logitBias) logits[id] = logits[id]! + b;
  const r = cfg.repetitionPenalty;
  if (r !== 1) {
    const penalize = (id: number) => {
      const l = logits[id]!;
      logits[id] = l > 0 ? l / r : l * r;
    };
    for (const id of h.promptTokens) penalize(id);
    for (const id of h.outputCounts.keys()) if (!h.promptTokens.has(id)) penalize(id);
  }
  const f = cfg.frequencyPenalty;
  const p = cfg.presencePenalty;
  if (f !== 0 || p !== 0) {
    for (const [id, n] of h.outputCounts) logits[id] = logits[id]! - f * n - p;
  }
}

/** min_tokens: the tokens that would end the request cannot be sampled yet. */
export function maskStops(logits: Float32Array, stops: Iterable<number>): void {
  for (const id of stops) if (id < logits.length) logits[id] = -Infinity;
}
