import { afterAll, describe, expect, test } from "bun:test";
import { DEFAULT_MODEL_NAME } from "../../src/model/load/default-model.ts";
import { loadModel, loadTokenizerFor, SYNTHETIC_MODEL_NAME } from "../../src/model/index.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { writeLlama2cCheckpoint } from "../../src/model/load/llama2c.ts";
import { writeLlama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { writeFileSync } from "node:fs";
import { encodeGgufModel, writeHfFolder } from "../support/model-writers.ts";
import { CKPT, tempDir } from "./format-helpers.ts";

const tmp = tempDir("load");
afterAll(tmp.cleanup);

describe("load-model", () => {
  test("no --model: the embedded tl-kjv-small folder, through the HF loader", async () => {
    for (const modelPath of [undefined, "", DEFAULT_MODEL_NAME]) {
      const m = await loadModel({ modelPath });
      expect({ name: m.name, format: m.format, vocab: m.tokenizer.vocabSize, eos: m.eosIds, dtype: m.stats.dtype }).toEqual({
        name: DEFAULT_MODEL_NAME,
        format: "hf",
        vocab: 1024,
        eos: [1],
        dtype: "f16",
      });
      const t = await loadTokenizerFor({ modelPath });
      expect({ name: t.name, vocab: t.tokenizer.vocabSize, max: t.maxSeqLen }).toEqual({ name: DEFAULT_MODEL_NAME, vocab: 1024, max: 256 });
    }
  });

  test("--model tl-synthetic-4l: the seeded model with its byte tokenizer and size", async () => {
    const m = await loadModel({ modelPath: SYNTHETIC_MODEL_NAME });
    expect(m.name).toBe(SYNTHETIC_MODEL_NAME);
    expect(m.format).toBe("synthetic");
    expect(m.tokenizer.vocabSize).toBe(258);
    expect(m.eosIds).toEqual([257]);
    expect(m.stats.residentBytes).toBe(m.stats.parameters * 4);
  });

  test("the gateway's loadTokenizerFor reads a llama2.c header through the real parser", async () => {
    writeLlama2cCheckpoint(tmp.path("m.bin"), CKPT, syntheticWeights(CKPT, 2, { sharedClassifier: true }), true);
    writeLlama2cTokenizer(
      tmp.path("t.bin"),
      Array.from({ length: CKPT.vocabSize }, (_, i) => ({ piece: `p${i}`, score: 0 })),
    );
    const t = await loadTokenizerFor({ modelPath: tmp.path("m.bin"), tokenizerPath: tmp.path("t.bin"), maxSeqLen: 40 });
    expect({ name: t.name, vocab: t.tokenizer.vocabSize, max: t.maxSeqLen, v: t.vocabSize }).toEqual({
      name: "m",
      vocab: CKPT.vocabSize,
      max: 40,
      v: CKPT.vocabSize,
    });
    expect((await loadTokenizerFor({ modelPath: tmp.path("m.bin"), tokenizerPath: tmp.path("t.bin"), servedModelName: "x" })).name).toBe("x");
    await expect(loadTokenizerFor({ modelPath: tmp.path("t.bin"), tokenizerPath: tmp.path("t.bin") })).rejects.toThrow(
      /a llama2\.c tokenizer\.bin, not a model/,
    );
  });

  test("tokenizer.bin is read up to the checkpoint's vocabulary size", async () => {
    writeLlama2cTokenizer(
      tmp.path("big.bin"),
      Array.from({ length: CKPT.vocabSize + 1 }, (_, i) => ({ piece: `p${i}`, score: 0 })),
    );
    // tokenizer.bin has no count: read as the checkpoint's vocab, the extra entry is simply not read.
    const m = await loadModel({ modelPath: tmp.path("m.bin"), tokenizerPath: tmp.path("big.bin") });
    expect(m.tokenizer.vocabSize).toBe(CKPT.vocabSize);
  });

  test("an HF folder and a GGUF file load with their own tokenizers, templates and eos ids", async () => {
    const w = syntheticWeights(CKPT, 6);
    writeHfFolder(tmp.path("hf"), CKPT, w);
    const hf = await loadModel({ modelPath: tmp.path("hf"), servedModelName: "served" });
    expect({ name: hf.name, format: hf.format, template: hf.chatTemplate }).toEqual({ name: "served", format: "hf", template: "{{ messages }}" });
    expect(hf.tokenizer.encode("ab", { bos: false })).toEqual([3]); // the BPE merge "a b"
    expect(hf.eosIds).toContain(2);
    expect(hf.eosIds).toContain(3);
    writeFileSync(tmp.path("m.gguf"), encodeGgufModel(CKPT, w));
    const gg = await loadModel({ modelPath: tmp.path("m.gguf") });
    expect({ name: gg.name, format: gg.format, template: gg.chatTemplate, vocab: gg.tokenizer.vocabSize }).toEqual({
      name: "m",
      format: "gguf",
      template: "{{ messages }}",
      vocab: CKPT.vocabSize,
    });
    expect(gg.eosIds).toContain(2);
  });

  test("loadTokenizerFor reads no tensor data: a folder whose weights are garbage still gives the gateway its tokenizer", async () => {
    writeHfFolder(tmp.path("hf-gw"), CKPT, syntheticWeights(CKPT, 6));
    writeFileSync(tmp.path("hf-gw", "model.safetensors"), "not tensors");
    const t = await loadTokenizerFor({ modelPath: tmp.path("hf-gw"), maxSeqLen: 32 });
    expect({ name: t.name, vocab: t.vocabSize, max: t.maxSeqLen, template: t.chatTemplate }).toEqual({
      name: "hf-gw",
      vocab: CKPT.vocabSize,
      max: 32,
      template: "{{ messages }}",
    });
    await expect(loadModel({ modelPath: tmp.path("hf-gw") })).rejects.toThrow(/safetensors/);
  });
});
