import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { type Matrix, dtypeNameOf, isStacked } from "../../src/model/compute/packed.ts";
import { type ModelConfig, Transformer } from "../../src/model/index.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights, type Weights, weightsDType } from "../../src/model/compute/weights.ts";
import { generate } from "../../src/cli/generate.ts";
import { parseArgs } from "../../src/cli/options.ts";
import { encodeGgufModel, type GgufType } from "../support/model-writers.ts";
import { greedy, maxAbsDiff, tempDir } from "./format-helpers.ts";
import { bits, newPool, Seq } from "./helpers.ts";

// GGUF files of q4_k, q6_k, a Q4_K_M-like mix of both and the legacy 32-blocks, written here, loaded as stored (no
// matrix widened) and run by the integer kernels: the same greedy tokens as the same file
// widened to f32, logits within what 8-bit activations cost; the kernels, the plain-JS
// fallback and two threads all give the same bits.

const tmp = tempDir("quantized-load");
afterAll(() => tmp.cleanup());

// K-quant rows are whole super-blocks of 256.
const CFG: ModelConfig = {
  name: "kq",
  dim: 256,
  hiddenDim: 512,
  nLayers: 3,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 64,
  maxSeqLen: 32,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const W = syntheticWeights(CFG, 41);

/** llama.cpp's Q4_K_M recipe in miniature: q6_k for the classifier and for attn_v and ffn_down of some layers, q4_k elsewhere. */
function q4km(name: string): GgufType {
  if (name === "output.weight") return "q6_k";
  const m = /^blk\.(\d+)\.(attn_v|ffn_down)\.weight$/.exec(name);
  return m !== null && Number(m[1]) !== 1 ? "q6_k" : "q4_k";
}

const FILES: { name: string; typeOf: (n: string) => GgufType; want: Record<string, string>; bits?: number }[] = [
  ...(["q4_0", "q4_1", "q5_0", "q5_1"] as const).map((t, i) => ({
    name: t,
    typeOf: (): GgufType => t,
    want: { wq: t, w2: t, wcls: t, tokenEmbedding: t },
    bits: [4.5, 5, 5.5, 6][i]!,
  })),
  { name: "q4_k", typeOf: () => "q4_k", want: { wq: "q4_k", w2: "q4_k", wcls: "q4_k", tokenEmbedding: "q4_k" } },
  { name: "q6_k", typeOf: () => "q6_k", want: { wq: "q6_k", w2: "q6_k", wcls: "q6_k", tokenEmbedding: "q6_k" } },
  { name: "q5_k", typeOf: () => "q5_k", want: { wq: "q5_k", w2: "q5_k", wcls: "q5_k", tokenEmbedding: "q5_k" }, bits: 5.625 },
  {
    name: "q5_k_m",
    typeOf: (n) => (q4km(n) === "q6_k" ? "q6_k" : "q5_k"),
    want: { wq: "q5_k", wv: "q5_k+q6_k", w2: "q5_k+q6_k", wcls: "q6_k", tokenEmbedding: "q5_k" },
    bits: 6,
  },
  { name: "q4_k_m", typeOf: q4km, want: { wq: "q4_k", wv: "q4_k+q6_k", w2: "q4_k+q6_k", wcls: "q6_k", tokenEmbedding: "q4_k" } },
];

const PROMPTS = [
  [1, 5, 9, 33, 2],
  [1, 60, 61, 62, 7, 7, 7, 12, 40, 3, 3, 17],
];

function prefillLogits(w: Weights<Matrix>, prompt: readonly number[], opts: { threads?: number; simd?: boolean }): number[] {
  const m = new Transformer(CFG, w, opts);
  const out = new Float32Array(CFG.vocabSize);
  const seq = new Seq(newPool(CFG));
  m.forward(seq.pool, [seq.chunk(prompt)], out);
  m.close();
  return bits(out);
}

describe("quantized GGUF files served as stored", () => {
  for (const f of FILES) {
    const path = tmp.path(`${f.name}.gguf`);
    writeFileSync(path, encodeGgufModel(CFG, W, { typeOf: f.typeOf }));

    test(`${f.name}: every matrix kept in its stored dtype (a mixed layer stack in parts), none widened`, () => {
      const g = readModelFiles(path, { dtype: "as-stored" });
      for (const [k, dt] of Object.entries(f.want)) expect([k, dtypeNameOf(g.weights[k as keyof Weights<Matrix>] as Matrix)]).toEqual([k, dt]);
      expect(g.stats.widened).toBeUndefined();
      expect(weightsDType(g.weights)).toBe(f.name.endsWith("_m") ? "mixed" : (f.name as "q4_k"));
      if (f.name === "q4_k_m") {
        const w2 = g.weights.w2;
        // Layers 0 and 2 q6_k, layer 1 q4_k: three parts of one layer each.
        expect(isStacked(w2) && w2.parts.map((p) => (p instanceof Float32Array ? "f32" : p.dtype))).toEqual(["q6_k", "q4_k", "q6_k"]);
      }
      // Held at the file's bits per weight (q4_k 4.5, q6_k 6.5625, ...) over f32's 32, the norms aside.
      const f32 = readModelFiles(path);
      const ratio = g.stats.residentBytes / f32.stats.residentBytes;
      console.log(`${f.name}: held ${g.stats.residentBytes} bytes, ${ratio.toFixed(3)} of f32's`);
      expect(ratio).toBeLessThan((f.bits ?? (f.name === "q6_k" ? 6.5625 : 5)) / 32 + 0.01);
    });

    test(`${f.name}: the widened file's greedy tokens but at near-ties, logits within the 8-bit activations' cost`, () => {
      const packed = readModelFiles(path, { dtype: "as-stored" });
      const widened = readModelFiles(path);
      let worst = 0;
      let sq = 0;
      let count = 0;
      let gaps = 0;
      for (const p of PROMPTS) {
        const got = greedy(packed.cfg, packed.weights, p, 8);
        const want = greedy(widened.cfg, widened.weights, p, 8);
        // The runs agree up to the first differing token; there the widened run's choice must
        // have been a near-tie (its top two logits closer than the bound below, twice).
        let same = 0;
        while (same < 8 && got.tokens[same] === want.tokens[same]) same++;
        worst = Math.max(worst, maxAbsDiff(got.logits.slice(0, same + 1), want.logits.slice(0, same + 1)));
        for (const l of want.logits) for (const v of l) (sq += v * v), count++;
        if (same < 8) {
          const l = want.logits[same]!;
          gaps = Math.max(gaps, l[want.tokens[same]!]! - l[got.tokens[same]!]!);
        }
      }
      // Activations quantized to 8 bits per 256 (each within half a step of max / 127, about
      // 0.4% of the block's largest) through 3 layers and the classifier: measured 1-4% of the
      // logits' RMS (about 4 here); the bound is 5%.
      const rms = Math.sqrt(sq / count);
      console.log(
        `${f.name}: max |logit - widened logit| ${worst.toExponential(2)}, logit RMS ${rms.toFixed(2)}, largest top-two gap where tokens differ ${gaps.toExponential(2)}`,
      );
      expect(gaps).toBeLessThan(2 * 0.05 * rms);
      expect(worst).toBeLessThan(0.05 * rms);
    });

    test(`${f.name}: the kernels, the plain-JS fallback and two threads give the same bits`, () => {
      const g = readModelFiles(path, { dtype: "as-stored" });
      for (const p of PROMPTS) {
        const one = prefillLogits(g.weights, p, { threads: 1 });
        expect(prefillLogits(g.weights, p, { simd: false })).toEqual(one);
        expect(prefillLogits(g.weights, p, { threads: 2 })).toEqual(one);
      }
    });
  }
});

describe("engine generate on a Q4_K_M-like GGUF", () => {
  test("held as stored on the model thread, it prints the widened file's greedy text", async () => {
    const path = tmp.path("q4_k_m.gguf");
    const run = async (dtype: string): Promise<string> => {
      let out = "";
      const { config, rest } = parseArgs(["--model", path, "--dtype", dtype, "--threads", "2", "--prompt", "<t5><t9> <t33>", "--max-tokens", "6"]);
      await generate(config, rest, (s) => {
        out += s;
      });
      return out.slice(0, out.indexOf("\n["));
    };
    const stored = await run("as-stored");
    expect(stored.length).toBeGreaterThan("<t5><t9> <t33>".length);
    expect(stored).toBe(await run("f32"));
  });
});
