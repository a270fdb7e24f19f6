import type { ModelConfig } from "../compute/index.ts";

/**
 * What a model's own config (HF config.json or GGUF metadata) says beyond the tensor shapes:
 * everything the weight assembler and the engine need, already checked against what this
 * transformer implements.
 */
export interface ModelSpec {
  cfg: ModelConfig;
  /** The classifier is the token embedding (no separate lm_head / output tensor). */
  tied: boolean;
  /** q/k/v projections carry biases (Qwen2). */
  biases: boolean;
  /** Row order of the q/k projections in the file; "split-half" is permuted at load. */
  ropeOrder: "interleaved" | "split-half";
  /** Every id that ends generation (Llama 3 has several); may be empty when the files give none. */
  eosIds: number[];
  bosId: number | null;
}

/** Thrown for a model this engine will not run: the message names the option and its value. */
export class UnsupportedModelError extends Error {}
