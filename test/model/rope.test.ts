import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import type { ModelConfig } from "../../src/model/index.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { ropeFrequencies } from "../../src/model/compute/config.ts";
import { splitHalfToInterleaved } from "../../src/model/load/rope-order.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { encodeGguf, GT, namedTensors, writeHfFolder } from "../support/model-writers.ts";
import { greedy, maxAbsDiff, PROMPTS, tempDir } from "./format-helpers.ts";

const tmp = tempDir("rope");
afterAll(tmp.cleanup);

describe("rope order", () => {
  test("HF rotate_half RoPE on split-half vectors == interleaved RoPE on the reordered vectors", () => {
    const hd = 8,
      half = 4;
    const q = Float32Array.from({ length: hd }, (_, i) => Math.sin(i + 1));
    const k = Float32Array.from({ length: hd }, (_, i) => Math.cos(3 * i));
    const freq = (i: number) => 1 / Math.pow(10000, (2 * i) / hd);
    const rotateHalf = (v: Float32Array, pos: number) => {
      const o = new Float64Array(hd);
      for (let i = 0; i < half; i++) {
        const c = Math.cos(pos * freq(i)),
          s = Math.sin(pos * freq(i));
        o[i] = v[i]! * c - v[i + half]! * s;
        o[i + half] = v[i + half]! * c + v[i]! * s;
      }
      return o;
    };
    const interleaved = (v: Float32Array, pos: number) => {
      const o = new Float64Array(hd);
      for (let i = 0; i < half; i++) {
        const c = Math.cos(pos * freq(i)),
          s = Math.sin(pos * freq(i));
        o[2 * i] = v[2 * i]! * c - v[2 * i + 1]! * s;
        o[2 * i + 1] = v[2 * i]! * s + v[2 * i + 1]! * c;
      }
      return o;
    };
    const dot = (a: Float64Array, b: Float64Array) => a.reduce((s, x, i) => s + x * b[i]!, 0);
    const qi = splitHalfToInterleaved(q, 1, hd, 1),
      ki = splitHalfToInterleaved(k, 1, hd, 1);
    for (const [pq, pk] of [
      [5, 2],
      [17, 17],
      [30, 0],
    ] as const) {
      expect(dot(interleaved(qi, pq), interleaved(ki, pk))).toBeCloseTo(dot(rotateHalf(q, pq), rotateHalf(k, pk)), 12);
    }
  });
});

const L3 = { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: 64 } as const;
const CFG: ModelConfig = {
  name: "l3",
  dim: 32,
  hiddenDim: 64,
  nLayers: 2,
  nHeads: 2,
  nKvHeads: 1,
  vocabSize: 64,
  maxSeqLen: 48,
  ropeTheta: 500000,
  normEps: 1e-5,
};

describe("llama3 rope scaling", () => {
  test("short wavelengths kept, long ones divided by factor, a blend between", () => {
    const plain = ropeFrequencies(CFG);
    const scaled = ropeFrequencies({ ...CFG, ropeScaling: L3 });
    let kept = 0,
      divided = 0,
      blended = 0;
    for (let i = 0; i < plain.length; i++) {
      const wavelen = (2 * Math.PI) / plain[i]!;
      if (wavelen < 64 / 4) {
        expect(scaled[i]).toBe(plain[i]!);
        kept++;
      } else if (wavelen > 64 / 1) {
        expect(scaled[i]).toBe(plain[i]! / 8);
        divided++;
      } else {
        const smooth = (64 / wavelen - 1) / (4 - 1);
        expect(scaled[i]).toBeCloseTo((1 - smooth) * (plain[i]! / 8) + smooth * plain[i]!, 15);
        blended++;
      }
    }
    expect([kept > 0, divided > 0, blended > 0]).toEqual([true, true, true]);
  });

  test("HF config rope_scaling llama3 == GGUF rope_freqs factors; both differ from unscaled", () => {
    const w = syntheticWeights(CFG, 3);
    writeHfFolder(tmp.path("l3"), CFG, w, {
      config: { rope_scaling: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 } },
    });
    const plain = ropeFrequencies(CFG);
    const scaled = ropeFrequencies({ ...CFG, ropeScaling: L3 });
    const factors = Float32Array.from(plain, (p, i) => p / scaled[i]!);
    // How llama.cpp's converter carries llama3 scaling: an f32 rope_freqs.weight tensor of divisors.
    writeFileSync(tmp.path("l3.gguf"), withRopeFreqs(CFG, w, factors));
    const hf = readModelFiles(tmp.path("l3"));
    const gg = readModelFiles(tmp.path("l3.gguf"));
    expect(hf.cfg.ropeScaling?.type).toBe("llama3");
    expect(gg.cfg.ropeScaling?.type).toBe("factors");
    for (const p of PROMPTS) {
      const a = greedy(hf.cfg, hf.weights, p, 12);
      const b = greedy(gg.cfg, gg.weights, p, 12);
      expect(b.tokens).toEqual(a.tokens);
      expect(maxAbsDiff(a.logits, b.logits)).toBeLessThan(1e-4);
    }
    const unscaled = greedy(CFG, w, PROMPTS[1]!, 12);
    expect(maxAbsDiff(unscaled.logits, greedy(hf.cfg, hf.weights, PROMPTS[1]!, 12).logits)).toBeGreaterThan(1e-3);
  });
});

function withRopeFreqs(cfg: ModelConfig, w: ReturnType<typeof syntheticWeights>, factors: Float32Array): Uint8Array {
  const kvs: [string, number, unknown][] = [
    ["general.architecture", GT.str, "llama"],
    ["llama.context_length", GT.u32, cfg.maxSeqLen],
    ["llama.embedding_length", GT.u32, cfg.dim],
    ["llama.block_count", GT.u32, cfg.nLayers],
    ["llama.feed_forward_length", GT.u32, cfg.hiddenDim],
    ["llama.attention.head_count", GT.u32, cfg.nHeads],
    ["llama.attention.head_count_kv", GT.u32, cfg.nKvHeads],
    ["llama.rope.freq_base", GT.f32, cfg.ropeTheta],
    ["llama.attention.layer_norm_rms_epsilon", GT.f32, cfg.normEps],
    ["tokenizer.ggml.model", GT.str, "gpt2"],
    ["tokenizer.ggml.tokens", GT.arr, [GT.str, Array.from({ length: cfg.vocabSize }, (_, i) => `t${i}`)]],
  ];
  const tensors = namedTensors(cfg, w, "gguf", { tied: false, splitHalf: false }).map((t) => ({ ...t, type: "f32" as const }));
  tensors.push({ name: "rope_freqs.weight", shape: [factors.length], type: "f32", data: factors });
  return encodeGguf(kvs, tensors);
}
