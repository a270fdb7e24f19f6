import { expect, test } from "bun:test";
import fc from "fast-check";
import { Pcg32, SAMPLE_STREAM, drawsPerToken, resumeRng, sample, stream, validateSampling, type SamplingConfig } from "../../src/rng/index.ts";
import { referenceSample } from "../support/reference-sampler.ts";

const GREEDY: SamplingConfig = { temperature: 0, topP: 0, topK: 0 };

function frequencies(logits: number[], cfg: SamplingConfig, seed: number, draws: number): number[] {
  const rng = stream(seed, SAMPLE_STREAM);
  const l = Float32Array.from(logits);
  const counts = new Array<number>(logits.length).fill(0);
  for (let i = 0; i < draws; i++) counts[sample(l, cfg, rng)]!++;
  return counts.map((c) => c / draws);
}

test("greedy argmax lowest index on ties takes no draw", () => {
  const logits = Float32Array.from([1, 5, -2, 5, 0, 5]);
  const rng = stream(3, SAMPLE_STREAM);
  const before = rng.state;
  expect(sample(logits, GREEDY, rng)).toBe(1);
  expect(sample(logits, { temperature: 0, topP: 0.5, topK: 3 }, rng)).toBe(1);
  expect(rng.state).toBe(before);
  expect(sample(logits, GREEDY, null)).toBe(1);
  expect(sample(Float32Array.from([-0, 0]), GREEDY, null)).toBe(0);
  expect(sample(Float32Array.from([-Infinity, -3, -1, -1]), GREEDY, null)).toBe(2);
  expect(drawsPerToken(GREEDY)).toBe(0);
});

test("seeded sample takes exactly one draw", () => {
  const logits = Float32Array.from({ length: 300 }, (_, i) => Math.sin(i * 1.7) * 4);
  const configs: SamplingConfig[] = [
    { temperature: 1, topP: 0, topK: 0 },
    { temperature: 0.7, topP: 0.9, topK: 0 },
    { temperature: 1.3, topP: 0, topK: 40 },
    { temperature: 0.5, topP: 0.3, topK: 100 },
    { temperature: 2, topP: 1e-9, topK: 1 },
    { temperature: 1, topP: 1, topK: 300 },
    { temperature: 1, topP: 0, topK: 5000 },
  ];
  for (const cfg of configs) {
    const rng = stream(11, SAMPLE_STREAM);
    const expected = rng.clone();
    for (let t = 0; t < 5; t++) {
      sample(logits, cfg, rng);
      expected.uniformF64();
      expect(rng.state).toBe(expected.state);
    }
    expect(drawsPerToken(cfg)).toBe(1);
  }
});

test("top k 1 equals greedy", () => {
  const logits = Float32Array.from([0.5, 3, 2.9, 3, -1]);
  const rng = stream(4, SAMPLE_STREAM);
  for (let i = 0; i < 50; i++) expect(sample(logits, { temperature: 1.5, topP: 0, topK: 1 }, rng)).toBe(1);
});

test("tiny top p equals greedy", () => {
  const logits = Float32Array.from([0.5, 3, 2.9, 3, -1]);
  const rng = stream(5, SAMPLE_STREAM);
  for (let i = 0; i < 50; i++) expect(sample(logits, { temperature: 1.5, topP: 1e-6, topK: 0 }, rng)).toBe(1);
});

test("two token distribution matches softmax", () => {
  // softmax([0, ln 3]) = [0.25, 0.75]; 20000 fixed-seed draws keep the error ~0.003 (1 sd).
  const f = frequencies([0, Math.log(3)], { temperature: 1, topP: 0, topK: 0 }, 21, 20000);
  expect(Math.abs(f[1]! - 0.75)).toBeLessThan(0.012);
  // Temperature 2 flattens it: p1 = sqrt(3) / (1 + sqrt(3)).
  const g = frequencies([0, Math.log(3)], { temperature: 2, topP: 0, topK: 0 }, 22, 20000);
  expect(Math.abs(g[1]! - Math.sqrt(3) / (1 + Math.sqrt(3)))).toBeLessThan(0.012);
});

test("top k and top p renormalize the survivors", () => {
  // p = [0.5, 0.3, 0.2]. top-k 2 keeps tokens 0 and 1 at 5/8 and 3/8.
  const logits = [Math.log(0.5), Math.log(0.3), Math.log(0.2)];
  const k = frequencies(logits, { temperature: 1, topP: 0, topK: 2 }, 31, 20000);
  expect(k[2]).toBe(0);
  expect(Math.abs(k[0]! - 0.625)).toBeLessThan(0.012);
  // top-p 0.7: 0.5 < 0.7 <= 0.8, so the same two survive.
  const p = frequencies(logits, { temperature: 1, topP: 0.7, topK: 0 }, 32, 20000);
  expect(p[2]).toBe(0);
  expect(Math.abs(p[0]! - 0.625)).toBeLessThan(0.012);
  // Off values keep all three.
  const all = frequencies(logits, { temperature: 1, topP: 1, topK: 0 }, 33, 20000);
  expect(Math.abs(all[2]! - 0.2)).toBeLessThan(0.012);
});

test("sample is replayable", () => {
  const logits = Float32Array.from({ length: 1000 }, (_, i) => Math.cos(i * 0.37) * 3);
  const cfg: SamplingConfig = { temperature: 0.8, topP: 0.95, topK: 50 };
  const a = stream(99, SAMPLE_STREAM);
  const b = Pcg32.fromState(a.state, a.inc);
  const first = Array.from({ length: 20 }, () => sample(logits, cfg, a));
  const again = Array.from({ length: 20 }, () => sample(logits, cfg, b));
  expect(again).toEqual(first);
  expect(new Set(first).size).toBeGreaterThan(1);
});

test("single engine equals prefill decode handoff", () => {
  const vocab = 64;
  const logitsAt = (step: number) => Float32Array.from({ length: vocab }, (_, i) => Math.sin(i * 0.9 + step) * 2);
  for (const cfg of [GREEDY, { temperature: 1, topP: 0.9, topK: 20 }]) {
    const single = stream(77, SAMPLE_STREAM);
    const tokens = Array.from({ length: 8 }, (_, step) => sample(logitsAt(step), cfg, single));

    const prefillRng = stream(77, SAMPLE_STREAM);
    const firstToken = sample(logitsAt(0), cfg, prefillRng);
    const decodeRng = resumeRng(77, drawsPerToken(cfg));
    const rest = Array.from({ length: 7 }, (_, i) => sample(logitsAt(i + 1), cfg, decodeRng));
    expect([firstToken, ...rest]).toEqual(tokens);
  }
});

test("sample matches reference order", () => {
  const logit = fc.oneof(
    { weight: 6, arbitrary: fc.float({ min: -20, max: 20, noNaN: true }) },
    { weight: 1, arbitrary: fc.constantFrom(-Infinity, -0, 0, 1, 2) },
  );
  fc.assert(
    fc.property(
      fc.array(logit, { minLength: 1, maxLength: 200 }),
      fc.double({ min: 0.05, max: 5, noNaN: true }),
      fc.constantFrom(0, 0.01, 0.5, 0.9, 0.999, 1),
      fc.nat({ max: 250 }),
      fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
      (values, temperature, topP, topK, seed) => {
        const logits = Float32Array.from(values);
        if (!logits.some((x) => Number.isFinite(x))) logits[0] = 0;
        const cfg = { temperature, topP, topK };
        const rng = stream(seed, SAMPLE_STREAM);
        const u = rng.clone().uniformF64();
        expect(sample(logits, cfg, rng)).toBe(referenceSample(logits, cfg, u));
      },
    ),
    { numRuns: 400, seed: 7 },
  );
});

test("sample rejects bad input", () => {
  const l = Float32Array.from([1, 2]);
  expect(() => sample(l, { temperature: 1, topP: 0, topK: 0 }, null)).toThrow();
  expect(() => sample(l, { temperature: -1, topP: 0, topK: 0 }, null)).toThrow();
  expect(() => sample(Float32Array.from([1, NaN]), { temperature: 1, topP: 0, topK: 0 }, stream(1, "s"))).toThrow();
  expect(() => sample(Float32Array.from([1, NaN]), GREEDY, null)).toThrow();
  expect(() => sample(new Float32Array(0), GREEDY, null)).toThrow();
});

test("validate sampling ranges", () => {
  expect(validateSampling({ temperature: 0, topP: 0, topK: 0 })).toBeNull();
  expect(validateSampling({ temperature: 100, topP: 1, topK: 4294967295 })).toBeNull();
  expect(validateSampling({ temperature: -0.1, topP: 0, topK: 0 })).toContain("temperature");
  expect(validateSampling({ temperature: 100.5, topP: 0, topK: 0 })).toContain("temperature");
  expect(validateSampling({ temperature: NaN, topP: 0, topK: 0 })).toContain("temperature");
  expect(validateSampling({ temperature: Infinity, topP: 0, topK: 0 })).toContain("temperature");
  expect(validateSampling({ temperature: 1, topP: 1.01, topK: 0 })).toContain("top_p");
  expect(validateSampling({ temperature: 1, topP: -0.5, topK: 0 })).toContain("top_p");
  expect(validateSampling({ temperature: 1, topP: NaN, topK: 0 })).toContain("top_p");
  expect(validateSampling({ temperature: 1, topP: 0.5, topK: 1.5 })).toContain("top_k");
  expect(validateSampling({ temperature: 1, topP: 0.5, topK: -1 })).toContain("top_k");
});
