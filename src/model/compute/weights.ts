import { kvDimOf, type ModelConfig, qDimOf, validateConfig } from "./config.ts";
import { LoadProgress } from "./load-progress.ts";
import { castMatrix, DTYPES, type DType, dtypeNameOf, heldBytesOf, isStacked, type Matrix, type StackedMatrix } from "./packed.ts";

/**
 * Weights in llama2.c's run.c layout. Every matrix is row-major (out, in) so that
 * xout[i] = sum_j W[i*in + j] * x[j]; per-layer tensors are stacked along a leading L axis.
 * Loaders give f32 matrices (the default M); castWeights may pack them (f16, bf16, q8_0: see
 * packed.ts) for the Transformer, which takes either. Norm gains are always f32.
 */
export interface Weights<M extends Matrix = Float32Array> {
  /** (vocab, dim) */
  tokenEmbedding: M;
  /** (L, dim) */
  rmsAtt: Float32Array;
  /** (L, qDim, dim): qDim = nHeads*headDim (= dim unless the config gives headDim) */
  wq: M;
  /** (L, kvDim, dim) */
  wk: M;
  /** (L, kvDim, dim) */
  wv: M;
  /** (L, dim, qDim) */
  wo: M;
  /** (L, dim) */
  rmsFfn: Float32Array;
  /** (L, hidden, dim) */
  w1: M;
  /** (L, dim, hidden) */
  w2: M;
  /** (L, hidden, dim) */
  w3: M;
  /** (dim) */
  rmsFinal: Float32Array;
  /** (vocab, dim); the same object as tokenEmbedding when the classifier is shared. */
  wcls: M;
  /** Projection biases (Qwen2): (L, qDim), (L, kvDim), (L, kvDim); all three or none. */
  bq?: Float32Array;
  bk?: Float32Array;
  bv?: Float32Array;
}

/** The tensors every model has; the optional biases are checked beside them. */
export type DenseWeightName = Exclude<keyof Weights, "bq" | "bk" | "bv">;

/** Element count of every tensor, in run.c file order. */
export function weightSizes(cfg: ModelConfig): Record<DenseWeightName, number> {
  const { dim, hiddenDim: hid, nLayers: L, vocabSize: V } = cfg;
  const kvDim = kvDimOf(cfg);
  const qDim = qDimOf(cfg);
  return {
    tokenEmbedding: V * dim,
    rmsAtt: L * dim,
    wq: L * qDim * dim,
    wk: L * kvDim * dim,
    wv: L * kvDim * dim,
    wo: L * dim * qDim,
    rmsFfn: L * dim,
    w1: L * hid * dim,
    w2: L * dim * hid,
    w3: L * hid * dim,
    rmsFinal: dim,
    wcls: V * dim,
  };
}

const NORMS = new Set<keyof Weights<Matrix>>(["rmsAtt", "rmsFfn", "rmsFinal"]);
/** The matrices, which may be packed; `in` is a row's length. */
export const MATRICES = ["tokenEmbedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"] as const;

function isMatrix(a: unknown): a is Matrix {
  if (a instanceof Float32Array) return true;
  const p = a as { dtype?: unknown; bytes?: unknown };
  if (typeof a !== "object" || a === null) return false;
  if (p.dtype === "stacked") return (a as StackedMatrix).parts.every(isMatrix);
  return (DTYPES as readonly unknown[]).includes(p.dtype) && p.dtype !== "f32" && p.bytes instanceof Uint8Array;
}

/** Row length (the `in` axis) of each matrix. */
export function matrixCols(cfg: ModelConfig, k: (typeof MATRICES)[number]): number {
  return k === "w2" ? cfg.hiddenDim : k === "wo" ? qDimOf(cfg) : cfg.dim;
}

/**
 * The weights with every matrix in `dtype` (`as-stored` keeps each as it is). A shared
 * classifier stays shared: the embedding is then read from the packed rows.
 */
export function castWeights(
  cfg: ModelConfig,
  w: Weights<Matrix>,
  dtype: DType | "as-stored",
  progress?: (line: string) => void,
  now?: () => number,
): Weights<Matrix> {
  if (dtype === "as-stored") return w;
  const out = { ...w };
  const todo = MATRICES.filter((k) => dtypeNameOf(w[k]) !== dtype && !(k === "wcls" && w.wcls === w.tokenEmbedding));
  // A conversion of a big model takes a while: say so (at most once a second), as a slow load does.
  const line = new LoadProgress(
    `${cfg.name} to ${dtype}`,
    todo.reduce((n, k) => n + heldBytesOf(w[k]), 0),
    progress,
    now,
    ["converting", "converted"],
  );
  for (const k of MATRICES) {
    if (k === "wcls" && w.wcls === w.tokenEmbedding) out.wcls = out.tokenEmbedding;
    else if (todo.includes(k)) {
      const stacked = isStacked(w[k]);
      out[k] = castMatrix(w[k], dtype, matrixCols(cfg, k), (n) => line.add(n));
      if (!stacked) line.add(heldBytesOf(w[k]));
    }
  }
  line.finish();
  return out;
}

/**
 * The weights as the engine holds them for `--dtype`: the option's dtype, or for "as-stored" the
 * file's when it is one the kernels read, else f32. Matrices the loader already kept packed in
 * it pass through untouched (castMatrix returns them as they are); any f32 ones are packed here.
 */
export function holdWeights(cfg: ModelConfig, weights: Weights<Matrix>, storedDType: string, opt: DType | "as-stored" = "as-stored"): Weights<Matrix> {
  const held = opt !== "as-stored" ? opt : (DTYPES as readonly string[]).includes(storedDType) ? (storedDType as DType) : "as-stored";
  return castWeights(cfg, weights, held);
}

/** Bytes the weights take in memory (a shared classifier counted once). */
export function weightsBytes(w: Weights<Matrix>): number {
  let bytes = 0;
  for (const t of new Set(Object.values(w) as (Matrix | undefined)[])) {
    if (t !== undefined) bytes += heldBytesOf(t);
  }
  return bytes;
}

/** The one dtype of every layer matrix, or "mixed". */
export function weightsDType(w: Weights<Matrix>): DType | "mixed" {
  const d = new Set(MATRICES.map((k) => dtypeNameOf(w[k])));
  return d.size === 1 && ![...d][0]!.includes("+") ? ([...d][0]! as DType) : "mixed";
}

/** Throws when a tensor's length disagrees with the config. */
export function validateWeights(cfg: ModelConfig, w: Weights<Matrix>): void {
  validateConfig(cfg);
  const sizes = weightSizes(cfg);
  for (const k of Object.keys(sizes) as DenseWeightName[]) {
    const a = w[k];
    if (NORMS.has(k) ? !(a instanceof Float32Array) : !isMatrix(a))
      throw new Error(`weights.${k}: want a Float32Array${NORMS.has(k) ? "" : " or a packed matrix"}`);
    if (a.length !== sizes[k]) throw new Error(`weights.${k} has ${a.length} elements, want ${sizes[k]}`);
  }
  const biases = { bq: cfg.nLayers * qDimOf(cfg), bk: cfg.nLayers * kvDimOf(cfg), bv: cfg.nLayers * kvDimOf(cfg) };
  const present = (["bq", "bk", "bv"] as const).filter((k) => w[k] !== undefined);
  if (present.length !== 0 && present.length !== 3) throw new Error(`weights has biases ${present.join(", ")}: want all of bq, bk, bv or none`);
  for (const k of present) {
    const a = w[k]!;
    if (!(a instanceof Float32Array)) throw new Error(`weights.${k}: want a Float32Array`);
    if (a.length !== biases[k]) throw new Error(`weights.${k} has ${a.length} elements, want ${biases[k]}`);
  }
}

export interface SyntheticOptions {
  /** Also draw q/k/v biases (Qwen2-style). Default false. */
  biases?: boolean;
  /** wcls === tokenEmbedding (llama2.c "shared weights"). Default false. */
  sharedClassifier?: boolean;
  /** Standard deviation of an unshared classifier's logits for a unit-RMS input. Default 4. */
  logitStd?: number;
}

/**
 * Deterministic random weights: the same (cfg, seed) always gives the same bits. Matrices are
 * uniform with variance 1/fan_in so every projection keeps unit-scale activations; the residual
 * writers (wo, w2) are shrunk by 1/sqrt(2L) so the stream does not grow with depth.
 */
export function syntheticWeights(cfg: ModelConfig, seed: number, opts: SyntheticOptions = {}): Weights {
  validateConfig(cfg);
  const sizes = weightSizes(cfg);
  const rng = splitmix32(seed);
  const { dim, hiddenDim: hid, nLayers: L } = cfg;
  const resid = 1 / Math.sqrt(2 * L);
  const uniform = (n: number, std: number): Float32Array => {
    // U(-a, a) has std a/sqrt(3).
    const a = std * Math.sqrt(3);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = (rng() * 2 ** -31 - 1) * a;
    return out;
  };
  const gains = (n: number): Float32Array => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = 1 + (rng() * 2 ** -31 - 1) * 0.1;
    return out;
  };
  const tokenEmbedding = uniform(sizes.tokenEmbedding, 1);
  const w: Weights = {
    tokenEmbedding,
    rmsAtt: gains(sizes.rmsAtt),
    wq: uniform(sizes.wq, 1 / Math.sqrt(dim)),
    wk: uniform(sizes.wk, 1 / Math.sqrt(dim)),
    wv: uniform(sizes.wv, 1 / Math.sqrt(dim)),
    wo: uniform(sizes.wo, resid / Math.sqrt(qDimOf(cfg))),
    rmsFfn: gains(sizes.rmsFfn),
    w1: uniform(sizes.w1, 1 / Math.sqrt(dim)),
    w2: uniform(sizes.w2, resid / Math.sqrt(hid)),
    w3: uniform(sizes.w3, 1 / Math.sqrt(dim)),
    rmsFinal: gains(sizes.rmsFinal),
    wcls: tokenEmbedding,
  };
  if (!opts.sharedClassifier) w.wcls = uniform(sizes.wcls, (opts.logitStd ?? 4) / Math.sqrt(dim));
  if (opts.biases) {
    w.bq = uniform(L * qDimOf(cfg), 0.5);
    w.bk = uniform(L * kvDimOf(cfg), 0.5);
    w.bv = uniform(L * kvDimOf(cfg), 0.5);
  }
  return w;
}

/** A small counter-based generator (splitmix32 finaliser): uint32 outputs, seedable, no allocation. */
export function splitmix32(seed: number): () => number {
  let s = seed | 0;
  return () => {
    s = (s + 0x9e3779b9) | 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
    z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
    return (z ^ (z >>> 15)) >>> 0;
  };
}
