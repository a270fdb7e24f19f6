import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { interleavedToSplitHalf, splitHalfToInterleaved } from "../../src/model/load/rope-order.ts";
import { loadModel, loadTokenizerFor } from "../../src/model/index.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { writeHfFolder } from "../support/model-writers.ts";
import { CKPT, greedy, llama2cReference, maxAbsDiff, PROMPTS, tempDir } from "./format-helpers.ts";
import { bits } from "./helpers.ts";

const tmp = tempDir("hf");
afterAll(tmp.cleanup);

const W = syntheticWeights(CKPT, 77);
const N = 16;

const llama2cRun = (prompt: number[]) => llama2cReference(tmp.dir, CKPT, W, prompt, N);

describe("hf folder equals llama2c", () => {
  test("rope reorder: split-half then back is the identity, and it moves rows", () => {
    const m = Float32Array.from({ length: 2 * 8 * 3 }, (_, i) => i);
    const split = interleavedToSplitHalf(m, 2, 8, 3);
    expect(Array.from(split.subarray(3, 6))).toEqual([6, 7, 8]); // row 1 of the split order is interleaved row 2
    expect(Array.from(splitHalfToInterleaved(split, 2, 8, 3))).toEqual(Array.from(m));
  });

  test("f32 safetensors: same greedy tokens and bit-identical logits", () => {
    const dir = tmp.path("f32");
    writeHfFolder(dir, CKPT, W);
    const hf = readModelFiles(dir);
    expect(hf.format).toBe("hf");
    expect(hf.name).toBe("f32");
    expect(hf.eosIds).toEqual([2, 3]); // config.json's 2, generation_config.json's [2, 3]
    expect(hf.stats).toEqual({ parameters: hf.stats.residentBytes / 4, dtype: "f32", residentBytes: hf.stats.residentBytes });
    expect(hf.tokenizerSource.kind).toBe("hf");
    if (hf.tokenizerSource.kind === "hf") {
      expect((hf.tokenizerSource.tokenizerJson as { model: { type: string } }).model.type).toBe("BPE");
      expect(hf.tokenizerSource.configEosIds).toEqual([2]);
      expect((hf.tokenizerSource.generationConfig as { eos_token_id: number[] }).eos_token_id).toEqual([2, 3]);
    }
    for (const p of PROMPTS) {
      const want = llama2cRun(p);
      const got = greedy(hf.cfg, hf.weights, p, N);
      expect(got.tokens).toEqual(want.tokens);
      expect(got.logits.map(bits)).toEqual(want.logits.map(bits));
    }
  });

  test("sharded safetensors with an index: bit-identical logits", () => {
    const dir = tmp.path("sharded");
    writeHfFolder(dir, CKPT, W, { shards: 3 });
    const hf = readModelFiles(dir);
    const want = llama2cRun(PROMPTS[1]!);
    expect(greedy(hf.cfg, hf.weights, PROMPTS[1]!, N).logits.map(bits)).toEqual(want.logits.map(bits));
  });

  // f16 keeps 11 significant bits, bf16 8: the logits of these unit-scale models move by at most
  // the bounds below (measured maxima: see the report), and greedy tokens still agree.
  for (const [dtype, bound] of [
    ["F16", 0.01],
    ["BF16", 0.08],
  ] as const) {
    test(`${dtype.toLowerCase()} safetensors: greedy tokens agree, logits within ${bound}`, () => {
      const dir = tmp.path(dtype);
      writeHfFolder(dir, CKPT, W, { dtype });
      const hf = readModelFiles(dir);
      expect(hf.stats.dtype).toBe(dtype.toLowerCase());
      for (const p of PROMPTS) {
        const want = llama2cRun(p);
        const got = greedy(hf.cfg, hf.weights, p, N);
        const err = maxAbsDiff(got.logits, want.logits);
        console.log(`${dtype} prompt ${p.length}: max |logit error| ${err.toExponential(2)}`);
        expect(err).toBeLessThan(bound);
        expect(got.tokens).toEqual(want.tokens);
      }
    });
  }
});

describe("hf chat template files", () => {
  const template = async (dir: string) => (await loadTokenizerFor({ modelPath: dir })).chatTemplate;
  const tokenizerConfig = (dir: string, cfg: Record<string, unknown>) => writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(cfg));

  test("chat_template.jinja beside tokenizer_config.json wins, as in transformers; chat_template.json is the last resort", async () => {
    const dir = tmp.path("templates");
    writeHfFolder(dir, CKPT, W);
    expect(await template(dir)).toBe("{{ messages }}");
    // Only the processor's chat_template.json: tokenizer_config's template still comes first.
    writeFileSync(join(dir, "chat_template.json"), JSON.stringify({ chat_template: "from json" }));
    expect(await template(dir)).toBe("{{ messages }}");
    tokenizerConfig(dir, { bos_token: "<s>", eos_token: "<s>" });
    expect(await template(dir)).toBe("from json");
    writeFileSync(join(dir, "chat_template.jinja"), "{{ 'from jinja' }}\n");
    expect(await template(dir)).toBe("{{ 'from jinja' }}\n");
    tokenizerConfig(dir, { bos_token: "<s>", eos_token: "<s>", chat_template: "{{ messages }}" });
    expect(await template(dir)).toBe("{{ 'from jinja' }}\n");
    // The engine's loader reads the same files.
    expect((await loadModel({ modelPath: dir })).chatTemplate).toBe("{{ 'from jinja' }}\n");
  });

  test("a malformed chat_template.json is refused naming the file", async () => {
    const dir = tmp.path("bad-template-json");
    writeHfFolder(dir, CKPT, W);
    tokenizerConfig(dir, { bos_token: "<s>", eos_token: "<s>" });
    writeFileSync(join(dir, "chat_template.json"), JSON.stringify({ chat_template: 7 }));
    await expect(template(dir)).rejects.toThrow(`${dir}/chat_template.json chat_template must be a string`);
  });
});
