import { expect, test } from "bun:test";
import {
  applyTokenBitmask,
  compileLogits,
  maskStops,
  processLogits,
  sample,
  stream,
  SAMPLE_STREAM,
  TokenHistory,
  tokenLogprobs,
  validateLogits,
  type LogitsConfig,
} from "../../src/rng/index.ts";

const cfg = (c: Partial<LogitsConfig>): LogitsConfig => ({ presencePenalty: 0, frequencyPenalty: 0, repetitionPenalty: 1, logitBias: new Map(), ...c });
const apply = (l: Float32Array, c: LogitsConfig, h: TokenHistory) => processLogits(l, compileLogits(c), h);

test("repetition_penalty divides positive and multiplies negative logits of prompt and output tokens, once each", () => {
  const h = new TokenHistory([0, 1, 1], true, 4);
  h.add(2);
  h.add(1);
  const l = new Float32Array([2, -2, 3, 4]);
  apply(l, cfg({ repetitionPenalty: 2 }), h);
  expect([...l]).toEqual([1, -4, 1.5, 4]);
});

test("frequency subtracts per occurrence and presence once, over output tokens only; logit_bias adds", () => {
  const h = new TokenHistory([3], false, 4);
  for (const t of [0, 0, 0, 1]) h.add(t);
  const l = new Float32Array([1, 1, 1, 1]);
  apply(
    l,
    cfg({
      frequencyPenalty: 0.5,
      presencePenalty: 0.25,
      logitBias: new Map([
        [2, -1],
        [3, 2],
      ]),
    }),
    h,
  );
  expect([...l]).toEqual([1 - 1.5 - 0.25, 1 - 0.5 - 0.25, 0, 3]);
  maskStops(l, [1, 99]);
  expect(l[1]).toBe(-Infinity);
});

test("processing changes logits, never the draw count: one draw per seeded token whatever is set", () => {
  const l = new Float32Array(64).map((_, i) => Math.sin(i) * 3);
  const h = new TokenHistory([1, 2, 3], true, 64);
  for (const c of [cfg({}), cfg({ repetitionPenalty: 1.5, frequencyPenalty: 2, presencePenalty: -2, logitBias: new Map([[5, 100]]) })]) {
    const x = l.slice();
    apply(x, c, h);
    const rng = stream(9n, SAMPLE_STREAM);
    const ref = stream(9n, SAMPLE_STREAM);
    sample(x, { temperature: 0.7, topP: 0.9, topK: 10 }, rng);
    ref.uniformF64();
    expect(rng.uniformF64()).toBe(ref.uniformF64());
  }
});

test("a token bitmask keeps exactly the set bits' tokens, counts the finite ones, and never changes the draw count", () => {
  const l = new Float32Array(70).map((_, i) => Math.cos(i) * 2);
  l[33] = -Infinity;
  const mask = new Int32Array(3);
  for (const id of [0, 5, 31, 32, 33, 64, 69]) mask[id >> 5]! |= 1 << (id & 31);
  const x = l.slice();
  expect(applyTokenBitmask(x, mask)).toBe(6);
  for (let i = 0; i < 70; i++) expect([i, x[i]]).toEqual([i, [0, 5, 31, 32, 33, 64, 69].includes(i) ? l[i] : -Infinity]);
  for (let seed = 0n; seed < 20n; seed++) {
    const rng = stream(seed, SAMPLE_STREAM);
    const ref = stream(seed, SAMPLE_STREAM);
    expect([0, 5, 31, 32, 64, 69]).toContain(sample(x, { temperature: 1.2, topP: 1, topK: 0 }, rng));
    ref.uniformF64();
    expect(rng.uniformF64()).toBe(ref.uniformF64());
  }
  expect(applyTokenBitmask(l.slice(), new Int32Array(3))).toBe(0);
});

test("tokenLogprobs: a log-softmax of the raw logits; top is descending, ties by lower id", () => {
  const l = new Float32Array([1, 3, 3, 0, -Infinity]);
  const r = tokenLogprobs(l, 0, 3);
  const z = Math.log(Math.exp(1) + 2 * Math.exp(3) + 1);
  expect(r.logprob).toBeCloseTo(1 - z, 12);
  expect(r.top.map(([id]) => id)).toEqual([1, 2, 0]);
  expect(r.top[0]![1]).toBeCloseTo(3 - z, 12);
  expect(tokenLogprobs(l, 4, 0)).toEqual({ logprob: -Infinity, top: [] });
});

test("validateLogits: vLLM's ranges", () => {
  expect(validateLogits(cfg({}), 10)).toBeNull();
  expect(validateLogits(cfg({ presencePenalty: 2.01 }), 10)).toContain("presence_penalty");
  expect(validateLogits(cfg({ repetitionPenalty: 0 }), 10)).toContain("repetition_penalty");
  expect(validateLogits(cfg({ logitBias: new Map([[10, 1]]) }), 10)).toContain("vocabulary");
  expect(validateLogits(cfg({ logitBias: new Map([[1, -100.5]]) }), 10)).toContain("[-100, 100]");
});
