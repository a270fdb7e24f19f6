import assert from "node:assert";
import type { Pcg32 } from "./pcg32.ts";

export interface SamplingConfig {
  /** 0 = greedy. */
  temperature: number;
  /** 0 or >= 1 = off. */
  topP: number;
  /** 0 = off. */
  topK: number;
}

/** Upper bound accepted for temperature; beyond it the distribution is flat to f64 precision anyway. */
const MAX_TEMPERATURE = 100;

// Candidates are ordered by one f64 key = descending-logit rank (32 bits) * 2^21 + index,
// so a native numeric sort yields "logit descending, ties by lower index" and every key
// is distinct. 32 + 21 bits stay within the 53 exact bits of an f64.
const INDEX_BITS = 2097152; // 2^21
const MAX_VOCAB = INDEX_BITS;
const INSERTION_SORT_MAX = 64;

/**
 * Logits no token can be sampled from (a NaN, a +Infinity, or every token masked): one
 * request's failure, never its batch's. The engine ends that request alone with this message.
 * `byRequest`: the request's own settings did it (a mask of every token, a penalty that
 * overflowed), not the model (a NaN).
 */
export class LogitsError extends Error {
  constructor(
    message: string,
    readonly byRequest: boolean,
  ) {
    super(message);
  }
}

/** Returns why `cfg` is out of range, or null when it is valid. */
export function validateSampling(cfg: SamplingConfig): string | null {
  const { temperature, topP, topK } = cfg;
  if (!Number.isFinite(temperature) || temperature < 0 || temperature > MAX_TEMPERATURE) {
    return `temperature must be in [0, ${MAX_TEMPERATURE}], got ${temperature}`;
  }
  if (!Number.isFinite(topP) || topP < 0 || topP > 1) {
    return `top_p must be in [0, 1], got ${topP}`;
  }
  if (!Number.isInteger(topK) || topK < 0 || topK > 0xffff_ffff) {
    return `top_k must be an integer in [0, 2^32), got ${topK}`;
  }
  return null;
}

/** Uniform draws `sample` takes per token with `cfg`: the hand-off's rng_draws_consumed for one token. */
export function drawsPerToken(cfg: SamplingConfig): 0 | 1 {
  return cfg.temperature === 0 ? 0 : 1;
}

// Scratch reused across calls: engines use one vocabulary size, so these are allocated once.
let scratchSize = 0;
let logitCopy = new Float32Array(0);
let logitBits = new Uint32Array(logitCopy.buffer);
let keys = new Float64Array(0);
let probs = new Float64Array(0);

function ensureScratch(n: number): void {
  if (scratchSize === n) return;
  scratchSize = n;
  logitCopy = new Float32Array(n);
  logitBits = new Uint32Array(logitCopy.buffer);
  keys = new Float64Array(n);
  probs = new Float64Array(n);
}

/**
 * Picks the next token id. The prefill and decode engines must both call this so a
 * seeded request yields the same tokens whichever engine samples (random-stream.md).
 *
 * Greedy (temperature 0): the argmax of `logits`, lowest index on ties; no draw is
 * taken and `rng` may be null.
 *
 * Otherwise exactly one `rng.uniformF64()` draw is taken, whatever filter applies:
 *  1. Filtered order: candidates sorted by logit descending, ties by lower index
 *     (-0 and +0 are equal logits).
 *  2. top-k (0 = off): keep the first k of that order.
 *  3. Probabilities, in f64, are the softmax over the survivors of step 2 (the whole
 *     vocabulary when top-k is off) at temperature T with max subtraction:
 *     w_j = exp((l_j - l_0) / T), W = sum of w_j in filtered order, p_j = w_j / W.
 *  4. top-p (0 or >= 1 = off): keep the shortest prefix whose running sum of p_j (in
 *     filtered order) is >= top_p; at least one candidate, all survivors if never reached.
 *  5. total = the running sum of p_j over the kept prefix; u = rng.uniformF64() (drawn
 *     here, after filtering); the token is the first kept candidate whose running sum
 *     of p_j exceeds u * total, or the last kept one if rounding leaves none.
 *
 * Logits must be free of NaN and +Infinity; -Infinity masks a token (sampling needs at
 * least one finite logit). Logits that break this throw a LogitsError, before any draw.
 */
export function sample(logits: Float32Array, cfg: SamplingConfig, rng: Pcg32 | null): number {
  const invalid = validateSampling(cfg);
  assert(invalid === null, invalid ?? "");
  const n = logits.length;
  assert(n > 0, "sample: empty logits");
  if (cfg.temperature === 0) return argmax(logits);
  assert(rng !== null, "sample: temperature > 0 needs an rng");
  assert(n <= MAX_VOCAB, `sample: vocab ${n} exceeds ${MAX_VOCAB}`);

  ensureScratch(n);
  logitCopy.set(logits);
  for (let i = 0; i < n; i++) {
    if (Number.isNaN(logitCopy[i]!)) throw nanAt(i);
    let bits = logitBits[i]!;
    if (bits === 0x8000_0000) bits = 0; // -0 ranks with +0
    // Order-preserving map of f32 bits to u32 (negatives: flip all; positives: set sign).
    const ordered = bits & 0x8000_0000 ? ~bits >>> 0 : (bits | 0x8000_0000) >>> 0;
    keys[i] = (0xffff_ffff - ordered) * INDEX_BITS + i;
  }

  const m = cfg.topK > 0 && cfg.topK < n ? cfg.topK : n;
  if (m < n) selectSmallest(keys, n, m);
  sortPrefix(keys, m, n);

  const maxLogit = logits[keys[0]! % INDEX_BITS]!;
  if (!Number.isFinite(maxLogit)) throw notFinite(keys[0]! % INDEX_BITS, maxLogit);
  const t = cfg.temperature;
  let weightSum = 0;
  for (let j = 0; j < m; j++) {
    const w = Math.exp((logits[keys[j]! % INDEX_BITS]! - maxLogit) / t);
    probs[j] = w;
    weightSum += w;
  }
  for (let j = 0; j < m; j++) probs[j] = probs[j]! / weightSum;

  let kept = m;
  let total = 0;
  const topP = cfg.topP;
  if (topP > 0 && topP < 1) {
    for (let j = 0; j < m; j++) {
      total += probs[j]!;
      if (total >= topP) {
        kept = j + 1;
        break;
      }
    }
  } else {
    for (let j = 0; j < m; j++) total += probs[j]!;
  }

  const target = rng.uniformF64() * total;
  let cum = 0;
  for (let j = 0; j < kept; j++) {
    cum += probs[j]!;
    if (cum > target) return keys[j]! % INDEX_BITS;
  }
  return keys[kept - 1]! % INDEX_BITS;
}

function argmax(logits: Float32Array): number {
  let best = 0;
  let bestValue = logits[0]!;
  if (Number.isNaN(bestValue)) throw nanAt(0);
  for (let i = 1; i < logits.length; i++) {
    const v = logits[i]!;
    if (Number.isNaN(v)) throw nanAt(i);
    if (v > bestValue) {
      best = i;
      bestValue = v;
    }
  }
  if (!Number.isFinite(bestValue)) throw notFinite(best, bestValue);
  return best;
}

function nanAt(i: number): LogitsError {
  return new LogitsError(`no token can be sampled: logit ${i} is NaN`, false);
}

/** The largest logit is +Infinity (a penalty or bias overflowed) or -Infinity (every token masked). */
function notFinite(i: number, v: number): LogitsError {
  return new LogitsError(
    v > 0 ? `no token can be sampled: logit ${i} is +Infinity after this request's processing` : "no token can be sampled: every token is masked",
    true,
  );
}

/** Reorders a[0..n) so a[0..k) holds its k smallest values (keys are distinct). */
function selectSmallest(a: Float64Array, n: number, k: number): void {
  const target = k - 1;
  let lo = 0;
  let hi = n - 1;
  while (hi > lo) {
    const mid = lo + ((hi - lo) >>> 1);
    const x = a[lo]!;
    const y = a[mid]!;
    const z = a[hi]!;
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : x < z ? x : y < z ? z : y;
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (a[i]! < pivot) i++;
      while (a[j]! > pivot) j--;
      if (i <= j) {
        const tmp = a[i]!;
        a[i] = a[j]!;
        a[j] = tmp;
        i++;
        j--;
      }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else return;
  }
}

/** Sorts a[0..k) ascending; `n` is a.length, so the full case needs no subarray view. */
function sortPrefix(a: Float64Array, k: number, n: number): void {
  if (k === n) {
    a.sort();
  } else if (k <= INSERTION_SORT_MAX) {
    for (let i = 1; i < k; i++) {
      const v = a[i]!;
      let j = i - 1;
      while (j >= 0 && a[j]! > v) {
        a[j + 1] = a[j]!;
        j--;
      }
      a[j + 1] = v;
    }
  } else {
    a.subarray(0, k).sort();
  }
}
