// bench/llamacpp.ts compares us with llama.cpp on GGUF files bench/gguf-shapes.ts writes; these
// tests hold what makes that comparison fair without running it: the shapes are the real
// models' (parameter counts as published), the file is one our loader reads with the shapes and
// types the writer meant, and its vocabulary builds a tokenizer.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BOS_ID, byteSymbols, EOS_ID, gaussianF16, type LlamaShape, randomF16, SHAPES, shapeTensors, writeShapeGguf } from "../../bench/gguf-shapes.ts";
import { buildTokenizer } from "../../src/tokenizer/index.ts";
import { ggmlTypeName, parseGguf } from "../../src/model/load/gguf.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { dtypeNameOf } from "../../src/model/compute/packed.ts";

const dir = mkdtempSync(join(tmpdir(), "tl-gguf-shapes-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const params = (s: LlamaShape) => shapeTensors(s).reduce((a, t) => a + t.shape.reduce((x, d) => x * d, 1), 0);

/** A shape small enough to write here, with GQA, an odd head count and a vocabulary past the fixed tokens. */
const SMALL: LlamaShape = { ...SHAPES["135m"]!, name: "small", dim: 96, hiddenDim: 160, nLayers: 3, nHeads: 3, nKvHeads: 1, vocabSize: 700 };

describe("gguf shapes", () => {
  test("each shape has its real model's published parameter count", () => {
    expect(params(SHAPES["135m"]!)).toBe(134_515_008); // SmolLM2-135M
    expect(params(SHAPES["1b"]!)).toBe(1_235_814_400); // Llama-3.2-1B
    expect(params(SHAPES["3b"]!)).toBe(3_212_749_824); // Llama-3.2-3B
    expect(params(SHAPES["8b"]!)).toBe(8_030_261_248); // Llama-3.1-8B
  });

  for (const tied of [true, false]) {
    test(`the written file loads with the shape's config, F16 matrices and F32 norms (tied ${tied})`, () => {
      const s = { ...SMALL, tied };
      const file = join(dir, `small-${tied}.gguf`);
      writeShapeGguf(file, s, 5);
      const g = parseGguf(new Uint8Array(readFileSync(file)), file);
      const want = shapeTensors(s);
      expect(g.tensors.map((t) => t.name)).toEqual(want.map((t) => t.name));
      expect(g.tensors.some((t) => t.name === "output.weight")).toBe(!tied);
      for (const [i, t] of g.tensors.entries()) {
        expect(t.shape).toEqual(want[i]!.shape);
        expect(ggmlTypeName(t.type)).toBe(t.shape.length === 2 ? "F16" : "F32");
        expect(t.offset % g.alignment).toBe(0);
      }
      const m = readModelFiles(file, { dtype: "as-stored" });
      expect(m.cfg).toMatchObject({ dim: 96, hiddenDim: 160, nLayers: 3, nHeads: 3, nKvHeads: 1, vocabSize: 700, ropeTheta: 100000 });
      expect(m.stats.parameters).toBe(params(s));
      expect(dtypeNameOf(m.weights.wq)).toBe("f16");
      expect(m.eosIds).toEqual([EOS_ID]);
    });
  }

  test("the vocabulary builds a byte-level tokenizer: text is its bytes after BOS, and decodes back", async () => {
    const file = join(dir, "small-true.gguf");
    const m = readModelFiles(file, { dtype: "as-stored" });
    const { tokenizer } = await buildTokenizer(m.tokenizerSource);
    const text = "héllo, world\n";
    const ids = tokenizer.encode(text);
    expect(ids).toEqual([BOS_ID, ...new TextEncoder().encode(text)]);
    expect(tokenizer.decode(ids.slice(1))).toBe(text);
    expect(new Set(byteSymbols()).size).toBe(256);
  });

  test("random f16 weights are finite, nonzero and within 2^-10 .. 2^-5 in magnitude", () => {
    const h = new Uint16Array(10001);
    randomF16(h, 9);
    const f = new Float16Array(h.buffer);
    let neg = 0;
    for (const x of f) {
      expect(Math.abs(x)).toBeGreaterThanOrEqual(2 ** -10);
      expect(Math.abs(x)).toBeLessThan(2 ** -4);
      if (x < 0) neg++;
    }
    expect(neg / f.length).toBeGreaterThan(0.45);
    expect(neg / f.length).toBeLessThan(0.55);
  });

  test("gaussian f16 weights have a trained layer's spread and its share of subnormals", () => {
    // sigma 0.02: P(|w| < 2^-14) = erf(2^-14 / (0.02 sqrt 2)) = 0.24%, each draw on its own.
    const h = new Uint16Array(400_000);
    gaussianF16(h, 7);
    const f = new Float16Array(h.buffer);
    let sub = 0;
    let sq = 0;
    for (let i = 0; i < f.length; i++) {
      expect(Number.isFinite(f[i]!)).toBe(true);
      if ((h[i]! & 0x7c00) === 0 && (h[i]! & 0x3ff) !== 0) sub++;
      sq += f[i]! * f[i]!;
    }
    expect(Math.sqrt(sq / f.length)).toBeCloseTo(0.02, 3);
    expect(sub / f.length).toBeGreaterThan(0.002);
    expect(sub / f.length).toBeLessThan(0.003);
  });
});
