/** Most alternatives a request may ask for per token (vLLM's default max_logprobs). */
export const MAX_TOP_LOGPROBS = 20;

/** The sampled token's log-probability and the `top` most likely tokens with theirs, best first. */
export interface TokenLogprobs {
  logprob: number;
  /** [token id, logprob], logprob descending, ties by lower id. */
  top: [number, number][];
}

/**
 * Log-probabilities of the model's distribution (log-softmax of the raw logits, before
 * temperature, penalties and filtering: vLLM's default "raw_logprobs"), in f64. Both
 * engines of a hand-off compute them from the same logits, so they agree exactly.
 */
export function tokenLogprobs(logits: Float32Array, token: number, top: number): TokenLogprobs {
  const n = logits.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logits[i]! > max) max = logits[i]!;
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(logits[i]! - max);
  const logZ = max + Math.log(sum);
  const best = topIndices(logits, Math.min(top, n));
  return { logprob: logits[token]! - logZ, top: best.map((id) => [id, logits[id]! - logZ]) };
}

/** The k largest logits' indices, descending, ties by lower index; k ≤ MAX_TOP_LOGPROBS keeps this a short insertion. */
function topIndices(logits: Float32Array, k: number): number[] {
  const out: number[] = [];
  if (k <= 0) return out;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i]!;
    if (out.length === k && !(v > logits[out[k - 1]!]!)) continue;
    let j = out.length === k ? k - 1 : out.length;
    while (j > 0 && v > logits[out[j - 1]!]!) {
      out[j] = out[j - 1]!;
      j--;
    }
    out[j] = i;
  }
  return out;
}
