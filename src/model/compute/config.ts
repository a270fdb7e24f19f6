import type { KvShape } from "../../codec/kv-shape.ts";
import { quote } from "../../codec/index.ts";

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
  /** Per-head width when it is not dim / nHeads (Qwen and some Llama variants give head_dim). */
  headDim?: number;
  /** How RoPE frequencies are remapped; absent or null: plain theta^(-2i/headDim). */
  ropeScaling?: RopeScaling | null;
}

/**
 * RoPE frequency remaps the transformer implements. "llama3" is Llama 3.1's smooth
 * interpolation between long and short wavelengths; "factors" divides each frequency by a
 * stored factor (how GGUF files carry Llama 3's remap: the rope_freqs tensor).
 */
export type RopeScaling =
  | { type: "llama3"; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositions: number }
  | { type: "factors"; factors: readonly number[] };

export const DEFAULT_ROPE_THETA = 10000;
export const DEFAULT_NORM_EPS = 1e-5;

export function headDimOf(cfg: ModelConfig): number {
  return cfg.headDim ?? cfg.dim / cfg.nHeads;
}

/** Width of all query heads together: the rows of wq, the columns of wo. */
export function qDimOf(cfg: ModelConfig): number {
  return headDimOf(cfg) * cfg.nHeads;
}

export function kvDimOf(cfg: ModelConfig): number {
  return headDimOf(cfg) * cfg.nKvHeads;
}

/**
 * The angular frequency of each rotated pair k < headDim/2: theta^(-2k/headDim), then remapped
 * as cfg.ropeScaling says. One table for every loader, so a format cannot drift from another.
 */
export function ropeFrequencies(cfg: ModelConfig): Float64Array {
  const hd = headDimOf(cfg);
  const half = hd / 2;
  const out = new Float64Array(half);
  const s = cfg.ropeScaling ?? null;
  for (let k = 0; k < half; k++) {
    const base = 1 / Math.pow(cfg.ropeTheta, (2 * k) / hd);
    out[k] = s === null ? base : s.type === "factors" ? base / s.factors[k]! : llama3Remap(base, s);
  }
  return out;
}

/** Llama 3.1: short wavelengths kept, long ones slowed by `factor`, a linear blend between. */
function llama3Remap(freq: number, s: Extract<RopeScaling, { type: "llama3" }>): number {
  const wavelen = (2 * Math.PI) / freq;
  const lowWavelen = s.originalMaxPositions / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositions / s.highFreqFactor;
  if (wavelen < highWavelen) return freq;
  if (wavelen > lowWavelen) return freq / s.factor;
  const smooth = (s.originalMaxPositions / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
  return (1 - smooth) * (freq / s.factor) + smooth * freq;
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
  if (cfg.headDim === undefined) {
    if (cfg.dim % cfg.nHeads !== 0) throw new Error(`model config dim ${cfg.dim} not divisible by nHeads ${cfg.nHeads}`);
  } else if (!Number.isInteger(cfg.headDim) || cfg.headDim < 1) throw new Error(`model config headDim = ${cfg.headDim}: want a positive integer`);
  if (cfg.nHeads % cfg.nKvHeads !== 0) throw new Error(`model config nHeads ${cfg.nHeads} not divisible by nKvHeads ${cfg.nKvHeads}`);
  const hd = headDimOf(cfg);
  if (hd % 2 !== 0) throw new Error(`model config head dim ${hd} is odd: RoPE rotates pairs`);
  const s = cfg.ropeScaling;
  if (s?.type === "factors" && s.factors.length !== hd / 2) throw new Error(`model config rope factors: ${s.factors.length}, want headDim/2 = ${hd / 2}`);
  if (s?.type === "factors" && !s.factors.every((f) => f > 0)) throw new Error("model config rope factors: want every factor > 0");
  if (s?.type === "llama3" && !(s.factor > 0 && s.lowFreqFactor > 0 && s.highFreqFactor > s.lowFreqFactor && s.originalMaxPositions > 0)) {
    throw new Error(
      `model config rope_scaling llama3 ${quote(s)}: want factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0`,
    );
  }
  if (!(cfg.ropeTheta > 0)) throw new Error(`model config ropeTheta ${cfg.ropeTheta}: want > 0`);
  if (!(cfg.normEps > 0)) throw new Error(`model config normEps ${cfg.normEps}: want > 0`);
}
