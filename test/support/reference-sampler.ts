// The sampler of random-stream.md transcribed plainly: a comparator sort of every index and
// arrays allocated per call. The rng tests check src/rng's keyed selection against it
// token for token; bench/sampler.ts times it as the naive baseline.
import type { SamplingConfig } from "../../src/rng/index.ts";

export function referenceSample(logits: Float32Array, cfg: SamplingConfig, u: number): number {
  const order = Array.from(logits.keys()).sort((a, b) => {
    const la = logits[a]!;
    const lb = logits[b]!;
    if (la !== lb) return la > lb ? -1 : 1;
    return a - b;
  });
  const m = cfg.topK > 0 && cfg.topK < order.length ? cfg.topK : order.length;
  const kept = order.slice(0, m);
  const max = logits[kept[0]!]!;
  const w = kept.map((i) => Math.exp((logits[i]! - max) / cfg.temperature));
  let sum = 0;
  for (const x of w) sum += x;
  const p = w.map((x) => x / sum);
  let n = m;
  let total = 0;
  if (cfg.topP > 0 && cfg.topP < 1) {
    for (let j = 0; j < m; j++) {
      total += p[j]!;
      if (total >= cfg.topP) {
        n = j + 1;
        break;
      }
    }
  } else {
    for (const x of p) total += x;
  }
  let cum = 0;
  for (let j = 0; j < n; j++) {
    cum += p[j]!;
    if (cum > u * total) return kept[j]!;
  }
  return kept[n - 1]!;
}
