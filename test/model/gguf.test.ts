import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import type { ModelConfig } from "../../src/model/index.ts";
import { parseGguf } from "../../src/model/load/gguf.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { toFloat32 } from "../../src/model/load/raw-tensor.ts";
import { encodeGgufModel, GT, writeHfFolder } from "../support/model-writers.ts";
import { CKPT, greedy, llama2cReference, maxAbsDiff, PROMPTS, tempDir } from "./format-helpers.ts";
import { bits, TINY } from "./helpers.ts";

const tmp = tempDir("gguf");
afterAll(tmp.cleanup);

const W = syntheticWeights(CKPT, 77);
const N = 16;

const reference = (prompt: number[]) => llama2cReference(tmp.dir, CKPT, W, prompt, N);

describe("gguf equals llama2c", () => {
  test("F32 GGUF (v3, Meta rope order as llama.cpp writes llama): bit-identical logits", () => {
    writeFileSync(tmp.path("f32.gguf"), encodeGgufModel(CKPT, W));
    const g = readModelFiles(tmp.path("f32.gguf"));
    expect(g.format).toBe("gguf");
    expect(g.name).toBe("f32");
    expect(g.eosIds).toEqual([2]);
    expect(g.tokenizerSource.kind).toBe("gguf");
    if (g.tokenizerSource.kind === "gguf") {
      expect(g.tokenizerSource.meta.model).toBe("llama");
      expect(g.tokenizerSource.meta.tokens.length).toBe(CKPT.vocabSize);
      expect(g.tokenizerSource.meta.chatTemplate).toBe("{{ messages }}");
      expect(g.tokenizerSource.meta.bosId).toBe(1);
    }
    for (const p of PROMPTS) {
      const want = reference(p);
      const got = greedy(g.cfg, g.weights, p, N);
      expect(got.tokens).toEqual(want.tokens);
      expect(got.logits.map(bits)).toEqual(want.logits.map(bits));
    }
  });

  test("GGUF v2 with a 64-byte alignment reads the same", () => {
    const bytes = encodeGgufModel(CKPT, W, { alignment: 64 });
    new DataView(bytes.buffer).setUint32(4, 2, true);
    writeFileSync(tmp.path("v2.gguf"), bytes);
    const g = readModelFiles(tmp.path("v2.gguf"));
    expect(greedy(g.cfg, g.weights, PROMPTS[0]!, N).logits.map(bits)).toEqual(reference(PROMPTS[0]!).logits.map(bits));
  });

  // Bounds on |logit error| over every greedy step (logits have std ~4): f16 rounds each weight
  // by <= 2^-11 relative, bf16 by <= 2^-8, q8_0 by <= amax/254 of its 32-block.
  for (const [type, bound] of [
    ["f16", 0.01],
    ["bf16", 0.08],
    ["q8_0", 0.15],
  ] as const) {
    test(`${type} GGUF: greedy tokens agree, logits within ${bound}`, () => {
      writeFileSync(tmp.path(`${type}.gguf`), encodeGgufModel(CKPT, W, { type }));
      const g = readModelFiles(tmp.path(`${type}.gguf`));
      expect(g.stats.dtype).toBe([type, "f32"].sort().join("+"));
      for (const p of PROMPTS) {
        const want = reference(p);
        const got = greedy(g.cfg, g.weights, p, N);
        const err = maxAbsDiff(got.logits, want.logits);
        console.log(`${type} prompt ${p.length}: max |logit error| ${err.toExponential(2)}`);
        expect(err).toBeLessThan(bound);
        expect(got.tokens).toEqual(want.tokens);
      }
    });
  }

  test("q4_0 GGUF: every weight within one quantization step; the prompt's logits within 2.5", () => {
    writeFileSync(tmp.path("q4_0.gguf"), encodeGgufModel(CKPT, W, { type: "q4_0" }));
    const g = readModelFiles(tmp.path("q4_0.gguf"));
    for (const k of ["wq", "w2", "wcls"] as const) {
      const a = W[k],
        b = g.weights[k];
      for (let blk = 0; blk < a.length / 32; blk++) {
        let amax = 0;
        for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(a[blk * 32 + j]!));
        // |d| = amax/8 (f16): rounding costs <= |d|/2, except that the extreme opposite the
        // block's max clamps to 7|d| (q4_0's range is -8..7), costing up to |d|; f16 d adds 8 ulps.
        for (let j = 0; j < 32; j++) expect(Math.abs(a[blk * 32 + j]! - b[blk * 32 + j]!)).toBeLessThanOrEqual((amax / 8) * (1 + 8 * 2 ** -11) + 1e-7);
      }
    }
    // 4-bit weights move 16-step greedy runs apart, so only the prefill logits are compared.
    for (const p of PROMPTS) {
      const err = maxAbsDiff(greedy(g.cfg, g.weights, p, 1).logits, reference(p).logits.slice(0, 1));
      console.log(`q4_0 prompt ${p.length}: max |prefill logit error| ${err.toExponential(2)}`);
      expect(err).toBeLessThan(2.5);
    }
  });
});

describe("32-value legacy blocks and q5_k", () => {
  const bytes = (n: number) => Uint8Array.from({ length: n }, (_, i) => (i * 151 + 7) & 0xff);
  const f16 = (dv: DataView, at: number, bits: number) => dv.setUint16(at, bits, true);
  test("q4_1, q5_0, q5_1 dequantize by ggml's definitions", () => {
    for (const [dtype, size] of [
      ["q4_1", 20],
      ["q5_0", 22],
      ["q5_1", 24],
    ] as const) {
      const b = bytes(2 * size);
      const dv = new DataView(b.buffer);
      for (const blk of [0, 1]) {
        f16(dv, blk * size, blk ? 0xb400 : 0x3800); // d = -0.25, 0.5
        if (dtype !== "q5_0") f16(dv, blk * size + 2, 0x3c00); // m = 1
      }
      const got = toFloat32({ name: dtype, dtype, shape: [64], bytes: b });
      for (const blk of [0, 1]) {
        const at = blk * size;
        const d = blk ? -0.25 : 0.5;
        const qsAt = at + (dtype === "q4_1" ? 4 : dtype === "q5_0" ? 6 : 8);
        const qh = dtype === "q4_1" ? 0 : dv.getUint32(qsAt - 4, true);
        for (let j = 0; j < 16; j++) {
          const xh0 = ((qh >>> j) << 4) & 0x10,
            xh1 = (qh >>> (j + 12)) & 0x10;
          const lo = (b[qsAt + j]! & 0x0f) | xh0,
            hi = (b[qsAt + j]! >> 4) | xh1;
          const want = dtype === "q5_0" ? [(lo - 16) * d, (hi - 16) * d] : [lo * d + 1, hi * d + 1];
          expect([got[blk * 32 + j], got[blk * 32 + j + 16]]).toEqual(want);
        }
      }
    }
  });

  test("q5_k dequantizes by ggml's definition", () => {
    const b = bytes(176);
    const dv = new DataView(b.buffer);
    f16(dv, 0, 0x3c00); // d = 1
    f16(dv, 2, 0x3400); // dmin = 0.25
    const got = toFloat32({ name: "k5", dtype: "q5_k", shape: [256], bytes: b });
    const scaleMin = (j: number): [number, number] => {
      const q = (i: number) => b[4 + i]!;
      return j < 4 ? [q(j) & 63, q(j + 4) & 63] : [(q(j + 4) & 0xf) | ((q(j - 4) >> 6) << 4), (q(j + 4) >> 4) | ((q(j) >> 6) << 4)];
    };
    let u1 = 1,
      u2 = 2,
      is = 0,
      ql = 48,
      y = 0;
    for (let j = 0; j < 256; j += 64) {
      const [s1, m1] = scaleMin(is),
        [s2, m2] = scaleMin(is + 1);
      for (let l = 0; l < 32; l++) expect(got[y + l]).toBe(Math.fround(s1 * ((b[ql + l]! & 0xf) + (b[16 + l]! & u1 ? 16 : 0)) - 0.25 * m1));
      for (let l = 0; l < 32; l++) expect(got[y + 32 + l]).toBe(Math.fround(s2 * ((b[ql + l]! >> 4) + (b[16 + l]! & u2 ? 16 : 0)) - 0.25 * m2));
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
      y += 64;
    }
  });
});

describe("q6_k", () => {
  test("q6_k dequantizes by ggml's definition", () => {
    // Two super-blocks with varied bytes; the expected values follow ggml's loop literally.
    const b = Uint8Array.from({ length: 420 }, (_, i) => (i * 73 + 19) & 0xff);
    const dv = new DataView(b.buffer);
    dv.setUint16(208, 0x3400, true); // 0.25
    dv.setUint16(418, 0xb800, true); // -0.5
    const got = toFloat32({ name: "k6", dtype: "q6_k", shape: [2, 256], bytes: b });
    for (let blk = 0; blk < 2; blk++) {
      const base = blk * 210;
      const d = blk === 0 ? 0.25 : -0.5;
      const s8 = (i: number) => (b[base + 192 + i]! << 24) >> 24;
      for (let n = 0; n < 2; n++) {
        const ql = base + 64 * n,
          qh = base + 128 + 32 * n,
          sc = 8 * n,
          y = blk * 256 + 128 * n;
        for (let l = 0; l < 32; l++) {
          const is = Math.floor(l / 16);
          const q1 = ((b[ql + l]! & 0xf) | (((b[qh + l]! >> 0) & 3) << 4)) - 32;
          const q2 = ((b[ql + l + 32]! & 0xf) | (((b[qh + l]! >> 2) & 3) << 4)) - 32;
          const q3 = ((b[ql + l]! >> 4) | (((b[qh + l]! >> 4) & 3) << 4)) - 32;
          const q4 = ((b[ql + l + 32]! >> 4) | (((b[qh + l]! >> 6) & 3) << 4)) - 32;
          expect([got[y + l], got[y + l + 32], got[y + l + 64], got[y + l + 96]]).toEqual([
            Math.fround(d * s8(sc + is) * q1),
            Math.fround(d * s8(sc + is + 2) * q2),
            Math.fround(d * s8(sc + is + 4) * q3),
            Math.fround(d * s8(sc + is + 6) * q4),
          ]);
        }
      }
    }
  });
});

describe("q4_k", () => {
  // Q4_K blocks are 256 values along a row, so this model's rows are 256 wide.
  const WIDE: ModelConfig = {
    name: "wide",
    dim: 256,
    hiddenDim: 256,
    nLayers: 1,
    nHeads: 4,
    nKvHeads: 2,
    vocabSize: 64,
    maxSeqLen: 16,
    ropeTheta: 10000,
    normEps: 1e-5,
  };
  const WW = syntheticWeights(WIDE, 8);
  test("Q4_K GGUF: weights within 1.6 steps of their sub-block, prefill logits within 1.5", () => {
    writeFileSync(tmp.path("q4k.gguf"), encodeGgufModel(WIDE, WW, { type: "q4_k" }));
    const g = readModelFiles(tmp.path("q4k.gguf"));
    expect(g.stats.dtype).toBe("f32+q4_k");
    for (const k of ["wq", "w1", "wcls"] as const) {
      const a = WW[k],
        b = g.weights[k];
      for (let s = 0; s < a.length / 32; s++) {
        const v = a.subarray(s * 32, s * 32 + 32);
        const step = (Math.max(...v) - Math.min(0, ...v)) / 15;
        // Rounding to a nibble costs half a step; 6-bit scales and mins cost up to about one more.
        for (let j = 0; j < 32; j++) expect(Math.abs(v[j]! - b[s * 32 + j]!)).toBeLessThanOrEqual(1.6 * step + 1e-6);
      }
    }
    const p = [1, 7, 30, 2, 9];
    const want = greedy(WIDE, WW, p, 1).logits;
    const err = maxAbsDiff(greedy(g.cfg, g.weights, p, 1).logits, want);
    console.log(`q4_k: max |prefill logit error| ${err.toExponential(2)}`);
    expect(err).toBeLessThan(1.5);
  });

  test("a quantized tensor whose rows are not whole blocks is refused", () => {
    expect(() => readModelFiles((writeFileSync(tmp.path("bad-q4k.gguf"), encodeGgufModel(CKPT, W, { type: "q4_k" })), tmp.path("bad-q4k.gguf")))).toThrow(
      /rows of 32 are not whole Q4_K blocks of 256/,
    );
  });
});

/** Qwen2-shaped: q/k/v biases, tied embeddings, head_dim (16) != dim / heads (8), GQA. */
const QWEN: ModelConfig = { ...TINY, name: "qwen", maxSeqLen: 48, ropeTheta: 1000000, normEps: 1e-6, headDim: 16 };
const QW = syntheticWeights(QWEN, 91, { sharedClassifier: true, biases: true });

describe("qwen2 arch biases tied head dim", () => {
  test("HF qwen2 folder and qwen2 GGUF (NEOX order) give the logits of the weights themselves, bit for bit", () => {
    writeHfFolder(tmp.path("qwen-hf"), QWEN, QW, { modelType: "qwen2", tied: true });
    writeFileSync(tmp.path("qwen.gguf"), encodeGgufModel(QWEN, QW, { arch: "qwen2", tied: true }));
    const hf = readModelFiles(tmp.path("qwen-hf"));
    const gg = readModelFiles(tmp.path("qwen.gguf"));
    for (const m of [hf, gg]) {
      expect(m.cfg.headDim).toBe(16);
      expect(m.weights.wcls).toBe(m.weights.tokenEmbedding);
      expect(m.weights.bq).toBeDefined();
    }
    expect(hf.stats.parameters).toBe(gg.stats.parameters);
    for (const p of PROMPTS) {
      const want = greedy(QWEN, QW, p, N);
      expect(greedy(hf.cfg, hf.weights, p, N).logits.map(bits)).toEqual(want.logits.map(bits));
      expect(greedy(gg.cfg, gg.weights, p, N).logits.map(bits)).toEqual(want.logits.map(bits));
    }
  });

  test("the biases matter (dropping them changes the logits)", () => {
    const noBias = { ...QW, bq: undefined, bk: undefined, bv: undefined };
    expect(greedy(QWEN, noBias, PROMPTS[0]!, 2).logits.map(bits)).not.toEqual(greedy(QWEN, QW, PROMPTS[0]!, 2).logits.map(bits));
  });
});

describe("gguf reader", () => {
  test("metadata of every value type, arrays included", () => {
    const bytes = encodeGgufModel(CKPT, W, {
      extraKvs: [
        ["t.u8", GT.u8, 200],
        ["t.i8", GT.i8, -5],
        ["t.u16", GT.u16, 60000],
        ["t.i16", GT.i16, -30000],
        ["t.i32", GT.i32, -7],
        ["t.f64", GT.f64, 0.1],
        ["t.bool", GT.bool, true],
        ["t.u64", GT.u64, 2 ** 40],
        ["t.i64", GT.i64, -(2 ** 40)],
        ["t.arr", GT.arr, [GT.arr, [[GT.u8, [1, 2]]]]],
      ],
    });
    const g = parseGguf(bytes, "x.gguf");
    expect([g.meta.get("t.u8"), g.meta.get("t.i8"), g.meta.get("t.u16"), g.meta.get("t.i16"), g.meta.get("t.i32")]).toEqual([200, -5, 60000, -30000, -7]);
    expect([g.meta.get("t.f64"), g.meta.get("t.bool"), g.meta.get("t.u64"), g.meta.get("t.i64")]).toEqual([0.1, true, 2 ** 40, -(2 ** 40)]);
    expect(g.meta.get("t.arr")).toEqual([[1, 2]]);
  });

  test("q4_k dequantizes by ggml's definition", () => {
    // One super-block: d = 1, dmin = 0.5, scales/mins 6-bit packed, nibbles 0..15.
    const b = new Uint8Array(144);
    const dv = new DataView(b.buffer);
    dv.setUint16(0, 0x3c00, true); // 1.0
    dv.setUint16(2, 0x3800, true); // 0.5
    const sc = [1, 2, 3, 4, 33, 40, 50, 63];
    const mn = [0, 1, 2, 3, 17, 20, 30, 62];
    for (let j = 0; j < 4; j++) {
      b[4 + j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
      b[8 + j] = mn[j]! | ((mn[j + 4]! >> 4) << 6);
      b[12 + j] = (sc[j + 4]! & 0xf) | ((mn[j + 4]! & 0xf) << 4);
    }
    for (let i = 0; i < 128; i++) b[16 + i] = (i % 16) | (((i * 7) % 16) << 4);
    const got = toFloat32({ name: "k", dtype: "q4_k", shape: [256], bytes: b });
    for (let pair = 0; pair < 4; pair++) {
      for (let l = 0; l < 32; l++) {
        const q = b[16 + 32 * pair + l]!;
        expect(got[64 * pair + l]).toBe(sc[2 * pair]! * (q & 0xf) - 0.5 * mn[2 * pair]!);
        expect(got[64 * pair + 32 + l]).toBe(sc[2 * pair + 1]! * (q >> 4) - 0.5 * mn[2 * pair + 1]!);
      }
    }
  });
});
