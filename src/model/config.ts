import type { KvShape } from "../codec/kv-shape.ts";

/** Hyper-parameters of a llama2.c-style decoder (RMSNorm, RoPE, GQA, SwiGLU). */
export interface ModelConfig {
  name: string;
  dim: number;
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  vocabSize: number;
  maxSeqLen: number;
  /** RoPE base; llama2.c hard-codes 10000. */
  ropeTheta: number;
  /** RMSNorm epsilon; llama2.c hard-codes 1e-5. */
  normEps: number;
}

export const DEFAULT_ROPE_THETA = 10000;
export const DEFAULT_NORM_EPS = 1e-5;

export function headDimOf(cfg: ModelConfig): number {
  return cfg.dim / cfg.nHeads;
}

export function kvDimOf(cfg: ModelConfig): number {
  return (cfg.dim / cfg.nHeads) * cfg.nKvHeads;
}

/** The KV block shape a pool needs to serve this model with `blockTokens` tokens per block. */
export function kvShapeOf(cfg: ModelConfig, blockTokens: number): KvShape {
  return { blockTokens, nLayers: cfg.nLayers, nKvHeads: cfg.nKvHeads, headDim: headDimOf(cfg) };
}

/** Throws when the shape cannot run: every other module may then trust these relations. */
export function validateConfig(cfg: ModelConfig): void {
  const ints: (keyof ModelConfig)[] = ["dim", "hiddenDim", "nLayers", "nHeads", "nKvHeads", "vocabSize", "maxSeqLen"];
  for (const k of ints) {
    const v = cfg[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new Error(`model config ${k} = ${String(v)}: want a positive integer`);
  }
  if (cfg.dim % cfg.nHeads !== 0) throw new Error(`model config dim ${cfg.dim} not divisible by nHeads ${cfg.nHeads}`);
  if (cfg.nHeads % cfg.nKvHeads !== 0) throw new Error(`model config nHeads ${cfg.nHeads} not divisible by nKvHeads ${cfg.nKvHeads}`);
  if ((cfg.dim / cfg.nHeads) % 2 !== 0) throw new Error(`model config head dim ${cfg.dim / cfg.nHeads} is odd: RoPE rotates pairs`);
  if (!(cfg.ropeTheta > 0)) throw new Error(`model config ropeTheta ${cfg.ropeTheta}: want > 0`);
  if (!(cfg.normEps > 0)) throw new Error(`model config normEps ${cfg.normEps}: want > 0`);
}
