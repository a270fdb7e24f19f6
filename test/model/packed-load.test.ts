import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { castWeights, syntheticWeights, type Weights, weightsDType } from "../../src/model/compute/weights.ts";
import type { DType, ModelConfig } from "../../src/model/index.ts";
import { type Matrix, dtypeNameOf, isStacked, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { encodeGgufModel, writeHfFolder } from "../support/model-writers.ts";
import { CKPT, greedy, PROMPTS, tempDir } from "./format-helpers.ts";
import { bits, TINY } from "./helpers.ts";

const tmp = tempDir("packed-load");
afterAll(() => tmp.cleanup());

const W = syntheticWeights(CKPT, 17);
/** Qwen2-shaped (biases, tied, head_dim 16 != dim / heads, GQA): split-half q/k rows in both formats. */
const QWEN: ModelConfig = { ...TINY, name: "qwen", maxSeqLen: 48, ropeTheta: 1000000, normEps: 1e-6, headDim: 16 };
const QW = syntheticWeights(QWEN, 91, { sharedClassifier: true, biases: true });
const MATRICES = ["tokenEmbedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"] as const;

interface Case {
  name: string;
  cfg: ModelConfig;
  dtype: DType;
  write: (path: string) => void;
}

const CASES: Case[] = [
  { name: "hf-f16", cfg: CKPT, dtype: "f16", write: (p) => writeHfFolder(p, CKPT, W, { dtype: "F16" }) },
  { name: "hf-bf16-sharded", cfg: CKPT, dtype: "bf16", write: (p) => writeHfFolder(p, CKPT, W, { dtype: "BF16", shards: 3 }) },
  { name: "hf-qwen-f16", cfg: QWEN, dtype: "f16", write: (p) => writeHfFolder(p, QWEN, QW, { modelType: "qwen2", tied: true, dtype: "F16" }) },
  { name: "g-f16.gguf", cfg: CKPT, dtype: "f16", write: (p) => writeFileSync(p, encodeGgufModel(CKPT, W, { type: "f16" })) },
  { name: "g-bf16.gguf", cfg: CKPT, dtype: "bf16", write: (p) => writeFileSync(p, encodeGgufModel(CKPT, W, { type: "bf16" })) },
  { name: "g-q8.gguf", cfg: CKPT, dtype: "q8_0", write: (p) => writeFileSync(p, encodeGgufModel(CKPT, W, { type: "q8_0" })) },
  { name: "g-qwen-q8.gguf", cfg: QWEN, dtype: "q8_0", write: (p) => writeFileSync(p, encodeGgufModel(QWEN, QW, { arch: "qwen2", tied: true, type: "q8_0" })) },
];

function packedBytes(w: Weights<Matrix>, k: (typeof MATRICES)[number]): Uint8Array {
  const m = w[k];
  if (m instanceof Float32Array) throw new Error(`${k} is f32, want packed`);
  // Layers read as stored are one part each: their bytes in order are the stacked matrix's.
  if (m.dtype === "stacked") return Uint8Array.from(Buffer.concat(m.parts.map((p) => (p as PackedMatrix).bytes)));
  return m.bytes;
}

describe("weights kept in their stored dtype", () => {
  for (const c of CASES) {
    test(`${c.name}: packed straight from the file = f32 then packed, bytes and logits bit for bit`, () => {
      const path = tmp.path(c.name);
      c.write(path);
      for (const dtype of ["as-stored", c.dtype] as const) {
        const direct = readModelFiles(path, { dtype });
        expect(weightsDType(direct.weights)).toBe(c.dtype);
        const old = castWeights(c.cfg, readModelFiles(path).weights, c.dtype);
        for (const k of MATRICES) expect(packedBytes(direct.weights, k)).toEqual(packedBytes(old, k));
        for (const p of PROMPTS.slice(0, 2)) {
          const got = greedy(direct.cfg, direct.weights, p, 6);
          const want = greedy(c.cfg, old, p, 6);
          expect(got.tokens).toEqual(want.tokens);
          expect(got.logits.map(bits)).toEqual(want.logits.map(bits));
        }
      }
    });
  }

  test("a packed file asked for another packed dtype stays as stored (cast later, layer by layer); f32 stays the default", () => {
    const path = tmp.path("hf-f16");
    expect(weightsDType(readModelFiles(path).weights)).toBe("f32");
    expect(weightsDType(readModelFiles(path, { dtype: "bf16" }).weights)).toBe("f16");
    expect(weightsDType(readModelFiles(path, { dtype: "q8_0" }).weights)).toBe("f16");
    expect(weightsDType(readModelFiles(path, { dtype: "f32" }).weights)).toBe("f32");
  });

  test("converting as stored gives the bytes of converting from f32: f16 to q8_0 and bf16, q8_0 to f16", () => {
    writeFileSync(tmp.path("q8.gguf"), encodeGgufModel(CKPT, W, { type: "q8_0" }));
    expect(weightsDType(readModelFiles(tmp.path("q8.gguf"), { dtype: "f16" }).weights)).toBe("q8_0");
    for (const [file, to] of [
      [tmp.path("hf-f16"), "q8_0"],
      [tmp.path("hf-f16"), "bf16"],
      [tmp.path("q8.gguf"), "f16"],
    ] as const) {
      const viaStored = castWeights(CKPT, readModelFiles(file, { dtype: to }).weights, to);
      const viaF32 = castWeights(CKPT, readModelFiles(file).weights, to);
      for (const k of MATRICES) {
        // Layers read as stored stay one part each (stacked); their bytes in order are the whole's.
        const a = viaStored[k]!;
        const b = viaF32[k] as PackedMatrix;
        expect(dtypeNameOf(a)).toBe(to);
        const aBytes = isStacked(a) ? Buffer.concat(a.parts.map((p) => (p as PackedMatrix).bytes)) : Buffer.from((a as PackedMatrix).bytes);
        expect(aBytes.equals(Buffer.from(b.bytes))).toBe(true);
      }
    }
  });

  test("a conversion that takes over a second says so, as a slow load does", () => {
    const lines: string[] = [];
    let t = 0;
    const w = readModelFiles(tmp.path("hf-f16"), { dtype: "q8_0" }).weights;
    // A clock that moves 600 ms a read: the line comes at most once a second, then a closing one.
    const now = () => (t += 600);
    castWeights(CKPT, w, "q8_0", (l) => lines.push(l), now);
    expect(lines.length).toBeGreaterThan(1);
    expect(lines[0]).toMatch(/^converting tiny to q8_0: \d+\/\d+ MiB$/);
    expect(lines.at(-1)).toMatch(/^converted tiny to q8_0: \d+ MiB in [\d.]+ s$/);
  });
});
