import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { parseGguf } from "../../src/model/load/gguf.ts";
import { parseSafetensors } from "../../src/model/load/safetensors.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { writeLlama2cCheckpoint } from "../../src/model/load/llama2c.ts";
import { writeLlama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { encodeGguf, encodeGgufModel, encodeSafetensors, GT, TINY_TOKENIZER_JSON, writeHfFolder } from "../support/model-writers.ts";
import { CKPT, tempDir } from "./format-helpers.ts";

const tmp = tempDir("fmt");
afterAll(tmp.cleanup);
const W = syntheticWeights(CKPT, 5);

function file(name: string, bytes: Uint8Array | string): string {
  const p = tmp.path(name);
  writeFileSync(p, bytes);
  return p;
}

/** Every refusal names the path and what it looks like, and lists what is supported. */
function refused(path: string, opts: { tokenizerPath?: string } = {}): string {
  try {
    readModelFiles(path, opts);
  } catch (e) {
    return (e as Error).message;
  }
  throw new Error(`${path} loaded`);
}

describe("model format detection refusals", () => {
  const cases: [string, () => string, RegExp][] = [
    ["missing path", () => tmp.path("nope"), /no such file or directory/],
    ["PyTorch zip pickle", () => file("pytorch_model.bin", Uint8Array.of(0x50, 0x4b, 3, 4, 0, 0, 0, 0)), /a PyTorch pickle \(a zip archive/],
    ["raw pickle", () => file("model.pt", Uint8Array.of(0x80, 2, 0x7d, 0x71, 0, 0x28)), /a PyTorch pickle/],
    ["legacy GGML", () => file("old.bin", new TextEncoder().encode("tjggxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")), /a legacy GGML file/],
    ["tokenizer.json", () => file("tokenizer.json", JSON.stringify(TINY_TOKENIZER_JSON)), /a tokenizer\.json, not a model/],
    ["config.json", () => file("config.json", JSON.stringify({ model_type: "llama" })), /a Hugging Face config\.json \(pass the folder/],
    ["other JSON", () => file("x.json", "[1,2]"), /a JSON file, not a model/],
    [
      "bare safetensors",
      () =>
        file(
          (mkdirSync(tmp.path("bare"), { recursive: true }), "bare/model.safetensors"),
          encodeSafetensors([{ name: "a", shape: [2], data: new Float32Array(2) }], "F32"),
        ),
      /a bare safetensors file; it needs config\.json/,
    ],
    [
      "tokenizer.bin as model",
      () =>
        file(
          "tokenizer.bin",
          (() => {
            const p = tmp.path("t.bin");
            writeLlama2cTokenizer(p, [
              { piece: "<unk>", score: 0 },
              { piece: "<s>", score: 0 },
              { piece: "</s>", score: 0 },
            ]);
            return readFileSync(p);
          })(),
        ),
      /a llama2\.c tokenizer\.bin, not a model/,
    ],
    [
      "random bytes",
      () =>
        file(
          "noise.bin",
          Uint8Array.from({ length: 100 }, (_, i) => (i * 37 + 11) & 0xff),
        ),
      /not a recognized model file/,
    ],
    ["empty file", () => file("empty.bin", ""), /an empty file/],
    [
      "versioned llama2.c export",
      () =>
        file(
          "v1.bin",
          Uint8Array.from({ length: 256 }, (_, i) => [0x32, 0x34, 0x6b, 0x61][i] ?? 1),
        ),
      /a versioned llama2\.c export \('ak42' header/,
    ],
    [
      "dir without config.json",
      () => {
        const d = tmp.path("ggufdir");
        mkdirSync(d, { recursive: true });
        writeFileSync(`${d}/m.gguf`, "");
        return d;
      },
      /a directory without config\.json \(it holds m\.gguf: pass that file\)/,
    ],
    [
      "HF cache entry",
      () => {
        const d = tmp.path("models--org--m");
        mkdirSync(`${d}/snapshots/abc`, { recursive: true });
        return d;
      },
      /a directory without config\.json \(a Hugging Face cache entry: pass its snapshots\/<revision> folder/,
    ],
    [
      "folder with only pickles",
      () => {
        const d = tmp.path("pt");
        mkdirSync(d, { recursive: true });
        writeFileSync(`${d}/config.json`, "{}");
        writeFileSync(`${d}/pytorch_model.bin`, "");
        return d;
      },
      /only PyTorch pickle weights \(pytorch_model\.bin\)/,
    ],
    [
      "shards without index",
      () => {
        const d = tmp.path("shards");
        mkdirSync(d, { recursive: true });
        writeFileSync(`${d}/config.json`, "{}");
        writeFileSync(`${d}/model-00001-of-00002.safetensors`, "");
        return d;
      },
      /without model\.safetensors\.index\.json/,
    ],
    [
      "GGUF with Q3_K and IQ4_XS tensors",
      () =>
        file(
          "q3k.gguf",
          encodeGguf(
            [["general.architecture", GT.str, "llama"]],
            [
              { name: "blk.0.ffn_down.weight", shape: [1, 256], type: "f32", bytes: new Uint8Array(110), typeId: 11 },
              { name: "blk.0.ffn_up.weight", shape: [1, 256], type: "f32", bytes: new Uint8Array(136), typeId: 23 },
            ],
          ),
        ),
      /a GGUF file with Q3_K, IQ4_XS tensors: Q3_K \(e\.g\. "blk\.0\.ffn_down\.weight"\), IQ4_XS \(e\.g\. "blk\.0\.ffn_up\.weight"\); supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K/,
    ],
  ];
  for (const [name, make, want] of cases) {
    test(`refuses ${name}`, () => {
      const path = make();
      const msg = refused(path);
      expect(msg).toMatch(want);
      expect(msg).toContain(path);
      if (!/Q3_K|no such file/.test(msg)) expect(msg).toContain("supported: a Hugging Face model folder");
    });
  }

  test("a bare safetensors file beside a config.json is told to pass its folder", () => {
    const d = tmp.path("hf-bare");
    writeHfFolder(d, CKPT, W);
    expect(refused(`${d}/model.safetensors`)).toMatch(new RegExp(`a bare safetensors file; pass its folder ${d}`));
  });

  test("a folder without tokenizer.json is refused by name", () => {
    const d = tmp.path("no-tok");
    writeHfFolder(d, CKPT, W);
    rmSync(`${d}/tokenizer.json`);
    writeFileSync(`${d}/tokenizer.model`, "");
    expect(refused(d)).toMatch(/tokenizer\.json is missing \(only tokenizer\.model, a SentencePiece file, is there\)/);
  });

  test("a GGUF string that is not UTF-8 is refused with its place", () => {
    const b = encodeGguf([["general.name", GT.str, "ab"]], []);
    b[24 + 8 + "general.name".length + 4 + 8] = 0xff;
    expect(() => parseGguf(b, "u.gguf")).toThrow(/GGUF u\.gguf: metadata "general\.name" at byte \d+ is not valid UTF-8/);
  });

  test("--tokenizer only with llama2.c; llama2.c needs it", () => {
    const d = tmp.path("hf-tok");
    writeHfFolder(d, CKPT, W);
    expect(refused(d, { tokenizerPath: "/x/tokenizer.bin" })).toMatch(
      /--tokenizer \/x\/tokenizer\.bin: only llama2\.c checkpoints take --tokenizer; --model is a Hugging Face folder/,
    );
    const ck = tmp.path("c.bin");
    writeLlama2cCheckpoint(ck, CKPT, W, false);
    expect(refused(ck)).toMatch(/is a llama2\.c checkpoint: it needs --tokenizer/);
  });

  test("GGUF versions other than 2 and 3 are refused", () => {
    for (const v of [1, 4]) {
      const b = encodeGgufModel(CKPT, W);
      new DataView(b.buffer).setUint32(4, v, true);
      expect(refused(file(`v${v}.gguf`, b))).toMatch(new RegExp(`version ${v}; versions 2 and 3 are supported`));
    }
  });
});

describe("architecture refusals name the option", () => {
  const hf: [string, Record<string, unknown>, RegExp][] = [
    ["unknown model_type", { model_type: "gemma", architectures: undefined }, /model_type "gemma" is not supported \(supported: llama, mistral, qwen2\)/],
    ["architectures mismatch", { architectures: ["LlamaForSequenceClassification"] }, /architectures \["LlamaForSequenceClassification"\] is not supported/],
    ["MoE", { num_local_experts: 8 }, /num_local_experts = 8: mixture-of-experts models are not supported/],
    ["mistral sliding window", { model_type: "mistral", architectures: ["MistralForCausalLM"], sliding_window: 16 }, /sliding_window = 16 is not supported/],
    [
      "qwen2 sliding window in use",
      { model_type: "qwen2", architectures: ["Qwen2ForCausalLM"], use_sliding_window: true, sliding_window: 16 },
      /sliding_window = 16 is not supported/,
    ],
    ["rope_scaling linear", { rope_scaling: { type: "linear", factor: 2 } }, /rope_scaling type "linear" is not supported \(supported: llama3, default\)/],
    ["rope_scaling yarn", { rope_scaling: { rope_type: "yarn", factor: 4 } }, /rope_scaling type "yarn" is not supported/],
    ["attention_bias", { attention_bias: true }, /attention_bias = true \(a bias on o_proj too\) is not supported/],
    ["mlp_bias", { mlp_bias: true }, /mlp_bias = true is not supported/],
    ["hidden_act", { hidden_act: "gelu" }, /hidden_act "gelu" is not supported/],
    ["missing hidden_size", { hidden_size: undefined }, /hidden_size = undefined: want a positive integer/],
  ];
  for (const [name, config, want] of hf) {
    test(`HF config: ${name}`, () => {
      const d = tmp.path(`hf-${name.replaceAll(" ", "-")}`);
      writeHfFolder(d, CKPT, W, { config });
      expect(refused(d)).toMatch(want);
    });
  }

  test("HF: a mistral without a sliding window, or with one as long as the context, loads", () => {
    for (const w of [null, CKPT.maxSeqLen]) {
      const d = tmp.path(`mistral-${w}`);
      writeHfFolder(d, CKPT, W, { modelType: "mistral", config: { sliding_window: w } });
      expect(readModelFiles(d).cfg.nLayers).toBe(CKPT.nLayers);
    }
  });

  test("HF: a tensor the architecture does not use (o_proj bias) is refused, not ignored", () => {
    const d = tmp.path("obias");
    writeHfFolder(d, CKPT, W);
    writeHfFolder(d, CKPT, W, { shards: 2 });
    rmSync(`${d}/model.safetensors`);
    const idx = JSON.parse(readFileSync(`${d}/model.safetensors.index.json`, "utf8"));
    idx.weight_map["model.layers.0.self_attn.o_proj.bias"] = "extra.safetensors";
    writeFileSync(`${d}/model.safetensors.index.json`, JSON.stringify(idx));
    writeFileSync(
      `${d}/extra.safetensors`,
      encodeSafetensors([{ name: "model.layers.0.self_attn.o_proj.bias", shape: [32], data: new Float32Array(32) }], "F32"),
    );
    expect(refused(d)).toMatch(/tensors model\.layers\.0\.self_attn\.o_proj\.bias are not used by this architecture/);
  });

  test("HF: untied config without lm_head, and a wrong shape, are refused by tensor name", () => {
    const d = tmp.path("untied");
    writeHfFolder(d, CKPT, W, { tied: true, config: { tie_word_embeddings: false } });
    expect(refused(d)).toMatch(/tensor lm_head\.weight is missing/);
    const e = tmp.path("shape");
    writeHfFolder(e, CKPT, W, { config: { intermediate_size: 48 } });
    expect(refused(e)).toMatch(/tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[64,32\], want \[48,32\]/);
  });

  const gg: [string, Partial<{ arch: string }> & { kv: [string, number, unknown][] }, RegExp][] = [
    ["unknown architecture", { arch: "gemma", kv: [] }, /general\.architecture "gemma" is not supported \(supported: llama, qwen2\)/],
    ["MoE", { kv: [["llama.expert_count", GT.u32, 8]] }, /llama\.expert_count = 8: mixture-of-experts/],
    ["sliding window", { kv: [["llama.attention.sliding_window", GT.u32, 16]] }, /llama\.attention\.sliding_window = 16 is not supported/],
    ["rope scaling", { kv: [["llama.rope.scaling.type", GT.str, "linear"]] }, /llama\.rope\.scaling\.type "linear" is not supported/],
    ["partial rope", { kv: [["llama.rope.dimension_count", GT.u32, 4]] }, /llama\.rope\.dimension_count 4 \(partial RoPE/],
  ];
  for (const [name, o, want] of gg) {
    test(`GGUF metadata: ${name}`, () => {
      let b = encodeGgufModel(CKPT, W, { extraKvs: o.kv });
      if (o.arch) b = encodeGgufModel(CKPT, W, { extraKvs: [["general.architecture", GT.str, o.arch]] });
      expect(refused(file(`${name.replaceAll(" ", "-")}.gguf`, b))).toMatch(want);
    });
  }
});

describe("hostile safetensors", () => {
  const good = encodeSafetensors([{ name: "a", shape: [2, 2], data: new Float32Array(4) }], "F32");
  const withHeader = (h: unknown, data = 16) => {
    const j = new TextEncoder().encode(JSON.stringify(h));
    const out = new Uint8Array(8 + j.length + data);
    new DataView(out.buffer).setBigUint64(0, BigInt(j.length), true);
    out.set(j, 8);
    return out;
  };
  const cases: [string, Uint8Array, RegExp][] = [
    [
      "header longer than the file",
      (() => {
        const b = good.slice();
        new DataView(b.buffer).setBigUint64(0, 1n << 40n, true);
        return b;
      })(),
      /header length 1099511627776 exceeds/,
    ],
    [
      "not JSON",
      (() => {
        const b = good.slice();
        b[8] = 0x7a;
        return b;
      })(),
      /header is not valid JSON/,
    ],
    ["offsets past the data", withHeader({ a: { dtype: "F32", shape: [4], data_offsets: [0, 32] } }), /data_offsets \[0,32\] outside the 16-byte data section/],
    ["length not dtype x shape", withHeader({ a: { dtype: "F32", shape: [3], data_offsets: [0, 16] } }), /16 bytes, want 12 for F32 \[3\]/],
    [
      "overlap",
      withHeader({ a: { dtype: "F32", shape: [2], data_offsets: [0, 8] }, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } }),
      /tensors a and b overlap/,
    ],
    ["unsupported dtype", withHeader({ a: { dtype: "I64", shape: [2], data_offsets: [0, 16] } }), /tensor "a" has dtype "I64": supported F32, F16, BF16/],
    ["bad shape", withHeader({ a: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }), /shape \[-1\] is not a list/],
    ["header not an object", withHeader([1]), /header is not a JSON object/],
  ];
  for (const [name, bytes, want] of cases) test(name, () => expect(() => parseSafetensors(bytes, "h.safetensors")).toThrow(want));
});

describe("hostile GGUF", () => {
  const good = encodeGgufModel(CKPT, W);
  test("every truncation is a clean error", () => {
    for (const n of [3, 8, 23, 24, 40, 100, 1000, 5000, good.length - 1]) expect(() => parseGguf(good.subarray(0, n), "t.gguf")).toThrow(/GGUF t\.gguf: /);
  });
  test("a string length past the file", () => {
    const b = good.slice();
    new DataView(b.buffer).setBigUint64(24, 1n << 50n, true); // first key's length
    expect(() => parseGguf(b, "t.gguf")).toThrow(/metadata key length \d+ exceeds/);
  });
  test("an array count past the file, an unknown value type, a bad alignment, a tensor past the end", () => {
    const arr = encodeGguf([["a", GT.arr, [GT.u8, [1, 2, 3]]]], []);
    new DataView(arr.buffer).setBigUint64(24 + 8 + 1 + 4 + 4, 1n << 40n, true);
    expect(() => parseGguf(arr, "a.gguf")).toThrow(/metadata "a" array length \d+ exceeds/);
    const vt = encodeGguf([["a", GT.u8, 1]], []);
    new DataView(vt.buffer).setUint32(24 + 8 + 1, 99, true);
    expect(() => parseGguf(vt, "v.gguf")).toThrow(/metadata "a" has unknown value type 99/);
    expect(() => parseGguf(encodeGguf([["general.alignment", GT.u32, 24]], []), "al.gguf")).toThrow(/general\.alignment 24 is not a power of two/);
    const t = encodeGguf([], [{ name: "x", shape: [8], type: "f32", data: new Float32Array(8) }]);
    expect(() => parseGguf(t.subarray(0, t.length - 4), "p.gguf")).toThrow(/tensor "x" ends at byte \d+, past the file's/);
  });
});
