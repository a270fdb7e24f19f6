// Sampler cost per token against a naive baseline (comparator sort of every index,
// arrays allocated per call) measured in the same run. Writes bench/results/sampler.json.
import { mkdirSync, writeFileSync } from "node:fs";
import { SAMPLE_STREAM, sample, stream, type SamplingConfig } from "../src/rng/index.ts";
import { referenceSample } from "../test/support/reference-sampler.ts";

const VOCAB = 32000;
const TOKENS = 200;

const gen = stream(1, "bench-logits");
const logits = Float32Array.from({ length: VOCAB }, () => (gen.uniformF64() - 0.5) * 20);

function time(fn: () => void): number {
  fn(); // warm-up
  const t0 = performance.now();
  for (let i = 0; i < TOKENS; i++) fn();
  return (performance.now() - t0) / TOKENS;
}

const configs: Record<string, SamplingConfig> = {
  full_vocab: { temperature: 1, topP: 0, topK: 0 },
  top_k_50: { temperature: 0.8, topP: 0, topK: 50 },
  top_p_0_9: { temperature: 0.8, topP: 0.9, topK: 0 },
};

const results: Record<string, { ms_per_token: number; baseline_ms_per_token: number; speedup: number }> = {};
for (const [name, cfg] of Object.entries(configs)) {
  const rng = stream(7, SAMPLE_STREAM);
  const ms = time(() => void sample(logits, cfg, rng));
  const base = stream(7, SAMPLE_STREAM);
  const baselineMs = time(() => void referenceSample(logits, cfg, base.uniformF64()));
  results[name] = { ms_per_token: ms, baseline_ms_per_token: baselineMs, speedup: baselineMs / ms };
  console.log(`${name}: ${ms.toFixed(3)} ms/token, naive ${baselineMs.toFixed(3)} ms/token, ratio ${(baselineMs / ms).toFixed(1)}x`);
}

mkdirSync(new URL("./results/", import.meta.url), { recursive: true });
writeFileSync(new URL("./results/sampler.json", import.meta.url), JSON.stringify({ vocab: VOCAB, tokens: TOKENS, results }, null, 2) + "\n");
