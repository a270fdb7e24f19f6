import { describe, expect, test } from "bun:test";
import { headDimOf } from "../../src/model/compute/config.ts";
import { hfModelSpec } from "../../src/model/load/hf-config.ts";

// config.json files shaped as the published ones are (every key they carry, values of the
// real models), so a key the spec does not know cannot make a real model fail to load.
const llama32_1b = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  head_dim: 64,
  hidden_act: "silu",
  hidden_size: 2048,
  initializer_range: 0.02,
  intermediate_size: 8192,
  max_position_embeddings: 131072,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 32,
  num_hidden_layers: 16,
  num_key_value_heads: 8,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_scaling: { factor: 32.0, high_freq_factor: 4.0, low_freq_factor: 1.0, original_max_position_embeddings: 8192, rope_type: "llama3" },
  rope_theta: 500000.0,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.45.0",
  use_cache: true,
  vocab_size: 128256,
};
const qwen25_05b = {
  architectures: ["Qwen2ForCausalLM"],
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  hidden_act: "silu",
  hidden_size: 896,
  initializer_range: 0.02,
  intermediate_size: 4864,
  max_position_embeddings: 32768,
  max_window_layers: 21,
  model_type: "qwen2",
  num_attention_heads: 14,
  num_hidden_layers: 24,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000.0,
  sliding_window: 32768,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.43.1",
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936,
};
const smollm2_135m = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 1,
  eos_token_id: 2,
  hidden_act: "silu",
  hidden_size: 576,
  initializer_range: 0.041666666666666664,
  intermediate_size: 1536,
  is_llama_config: true,
  max_position_embeddings: 8192,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 9,
  num_hidden_layers: 30,
  num_key_value_heads: 3,
  pad_token_id: 2,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_interleaved: false,
  rope_scaling: null,
  rope_theta: 100000,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.42.3",
  use_cache: true,
  vocab_size: 49152,
};
const mistral_v03 = {
  architectures: ["MistralForCausalLM"],
  attention_dropout: 0.0,
  bos_token_id: 1,
  eos_token_id: 2,
  hidden_act: "silu",
  hidden_size: 4096,
  initializer_range: 0.02,
  intermediate_size: 14336,
  max_position_embeddings: 32768,
  model_type: "mistral",
  num_attention_heads: 32,
  num_hidden_layers: 32,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-5,
  rope_theta: 1000000.0,
  sliding_window: null,
  tie_word_embeddings: false,
  torch_dtype: "bfloat16",
  use_cache: true,
  vocab_size: 32768,
};

describe("real-shaped config.json files", () => {
  test("Llama 3.2 1B: GQA, llama3 rope scaling, several eos ids, tied, context capped", () => {
    const s = hfModelSpec(llama32_1b, "llama", 4096);
    expect(s.cfg).toMatchObject({ dim: 2048, nLayers: 16, nHeads: 32, nKvHeads: 8, vocabSize: 128256, maxSeqLen: 4096, ropeTheta: 500000, normEps: 1e-5 });
    expect(s.cfg.ropeScaling).toEqual({ type: "llama3", factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: 8192 });
    expect(headDimOf(s.cfg)).toBe(64);
    expect(s.cfg.headDim).toBeUndefined(); // 2048 / 32 already
    expect({ tied: s.tied, biases: s.biases, order: s.ropeOrder, eos: s.eosIds, bos: s.bosId }).toEqual({
      tied: true,
      biases: false,
      order: "split-half",
      eos: [128001, 128008, 128009],
      bos: 128000,
    });
  });

  test("Qwen2.5 0.5B: biases, tied, the inactive sliding window ignored", () => {
    const s = hfModelSpec(qwen25_05b, "qwen", 2048);
    expect(s.cfg).toMatchObject({ dim: 896, nHeads: 14, nKvHeads: 2, vocabSize: 151936, ropeTheta: 1e6, normEps: 1e-6 });
    expect(headDimOf(s.cfg)).toBe(64);
    expect({ tied: s.tied, biases: s.biases, eos: s.eosIds }).toEqual({ tied: true, biases: true, eos: [151645] });
  });

  test("SmolLM2 135M and Mistral v0.3 load; Mistral v0.1's 4096 window does not", () => {
    expect(hfModelSpec(smollm2_135m, "smol").cfg).toMatchObject({ dim: 576, nHeads: 9, nKvHeads: 3, nLayers: 30, maxSeqLen: 8192 });
    expect(hfModelSpec(smollm2_135m, "smol").tied).toBe(true);
    expect(hfModelSpec(mistral_v03, "mistral").cfg).toMatchObject({ dim: 4096, nKvHeads: 8, vocabSize: 32768 });
    expect(() => hfModelSpec({ ...mistral_v03, sliding_window: 4096 }, "mistral")).toThrow(/config\.json sliding_window = 4096 is not supported/);
  });
});
