// Model throughput: prefill (one 512-token chunk) and batched decode, for the embedded
// tl-synthetic-4l and a llama2.c checkpoint of TinyStories-15M shape with random weights.
// Baselines measured in the same run:
// - the plain JS matmul (matmulRef: one output at a time, same order as the SIMD kernel) in
//   GFLOP/s, re-timed right before each phase (the machine is shared, so a single early baseline
//   drifts); each phase reports its effective matmul GFLOP/s (attention excluded) and the ratio;
// - bench/c/run_ref.c, a run.c-style C forward built as llama2.c's `make run` builds run.c
//   (gcc -O3, no fast-math), decoding the TinyStories-shape file greedily from BOS: its tok/s
//   against ours at batch 1 on the same file and the same positions, and how many of the greedy
//   tokens agree (our K/V cache is f16, run.c's f32, so they may part eventually).
import { spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KvPool } from "../src/pool/index.ts";
import {
  type ModelConfig,
  Transformer,
  type Weights,
  kvDimOf,
  kvShapeOf,
  loadLlama2cCheckpoint,
  loadSyntheticModel,
  syntheticWeights,
  writeLlama2cCheckpoint,
} from "../src/model/index.ts";
import { MatmulKernel, matmulRef } from "../src/model/matmul.ts";

const BLOCK = 16;

function timeIt(fn: () => void, minMs = 400): number {
  fn();
  let n = 0;
  const t0 = performance.now();
  let t = t0;
  do {
    fn();
    n++;
    t = performance.now();
  } while (t - t0 < minMs);
  return (t - t0) / n;
}

type Kernel = typeof matmulRef;

function matmulGflops(kernel: Kernel, rows: number, n: number, d: number, minMs = 400): number {
  const w = new Float32Array(n * d).map((_, i) => Math.sin(i));
  const x = new Float32Array(rows * n).map((_, i) => Math.cos(i));
  const y = new Float32Array(rows * d);
  const ms = timeIt(() => kernel(y, x, w, 0, rows, n, d), minMs);
  return (2 * rows * n * d) / ms / 1e6;
}

/** Multiply-adds per token in the layer matmuls (attention scores excluded), and the classifier's. */
function flopsPerToken(cfg: ModelConfig): { layers: number; cls: number } {
  const kv = kvDimOf(cfg);
  const perLayer = cfg.dim * cfg.dim * 2 + 2 * kv * cfg.dim + 3 * cfg.dim * cfg.hiddenDim;
  return { layers: 2 * cfg.nLayers * perLayer, cls: 2 * cfg.vocabSize * cfg.dim };
}

interface Phase {
  tokensPerSec: number;
  gflops: number;
  plainJsMatmulGflops: number;
  vsPlainJsMatmul: number;
}

const naiveBaseline = (): number => matmulGflops(matmulRef, 1, 256, 768, 300);

function benchModel(cfg: ModelConfig, weights: Weights, prefillLen: number) {
  const m = new Transformer(cfg, weights);
  const f = flopsPerToken(cfg);
  const phase = (tokens: number, ms: number, flops: number, naive: number): Phase => {
    const gflops = flops / ms / 1e6;
    return { tokensPerSec: (tokens / ms) * 1000, gflops, plainJsMatmulGflops: naive, vsPlainJsMatmul: gflops / naive };
  };

  // Prefill: a fresh pool per run so every run computes the whole prompt.
  const blocks = Math.ceil(prefillLen / BLOCK);
  const pool = new KvPool(kvShapeOf(cfg, BLOCK), blocks * 9);
  const table = pool.allocate(blocks)!;
  const prompt = Array.from({ length: prefillLen }, (_, i) => (i * 7919 + 13) % cfg.vocabSize);
  const out = new Float32Array(8 * cfg.vocabSize);
  let naive = naiveBaseline();
  const prefillMs = timeIt(() => m.forward(pool, [{ blockTable: table, startPos: 0, tokens: prompt }], out), 1500);
  const prefill = phase(prefillLen, prefillMs, prefillLen * f.layers + f.cls, naive);

  // Decode: each sequence has a 64-token context; every step adds one token per sequence,
  // rewinding to position 64 when the table is full so the context stays comparable.
  const decode: Record<string, Phase> = {};
  const ctx = 64;
  const steps = 64;
  for (const batch of [1, 8]) {
    const perSeq = Math.ceil((ctx + steps) / BLOCK);
    const dp = new KvPool(kvShapeOf(cfg, BLOCK), perSeq * batch);
    const tables = Array.from({ length: batch }, () => dp.allocate(perSeq)!);
    m.forward(
      dp,
      tables.map((t, s) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(s, s + ctx) })),
      out,
    );
    let pos = ctx;
    const chunks = tables.map((t) => ({ blockTable: t, startPos: 0, tokens: [0] }));
    naive = naiveBaseline();
    const ms = timeIt(() => {
      for (let s = 0; s < batch; s++) {
        chunks[s]!.startPos = pos;
        chunks[s]!.tokens[0] = (pos * 31 + s) % cfg.vocabSize;
      }
      m.forward(dp, chunks, out);
      pos = pos + 1 >= ctx + steps ? ctx : pos + 1;
    }, 1500);
    decode[`batch${batch}`] = phase(batch, ms, batch * (f.layers + f.cls), naive);
  }
  return { name: cfg.name, prefillLen, prefill, decode };
}

/** The SIMD kernel with w placed in its memory, as the Transformer uses it. */
function placedKernel(): Kernel {
  const kernels = new Map<Float32Array, MatmulKernel>();
  return (y, x, w, wOff, rows, n, d) => {
    let k = kernels.get(w);
    if (k === undefined) kernels.set(w, (k = new MatmulKernel([w])));
    k.matmul(y, x, w, wOff, rows, n, d);
  };
}

interface VersusC {
  steps: number;
  cTokensPerSec: number;
  /** Ours on the same greedy run at batch 1. */
  oursTokensPerSec: number;
  /** ours / C at batch 1: the target is >= 0.5. */
  ratio: number;
  /** Our decode phases (64..128-token contexts) over C's rate: batch 8 counts all 8 sequences' tokens. */
  decodeBatch1VsC: number;
  decodeBatch8VsC: number;
  /** Leading greedy tokens that agree, and agreeing positions overall. */
  prefixMatch: number;
  matches: number;
  cTokens: number[];
  oursTokens: number[];
}

interface Reference {
  exe: string;
  compiler: string;
}

/** Builds bench/c/run_ref.c as llama2.c's `make run` builds run.c; null when no compiler runs. */
function buildReference(dir: string): Reference | null {
  const src = join(import.meta.dir, "c", "run_ref.c");
  const exe = join(dir, "run_ref");
  for (const cc of ["gcc", "cc"]) {
    const r = spawnSync(cc, ["-O3", "-o", exe, src, "-lm"], { encoding: "utf8" });
    if (r.status === 0) return { exe, compiler: `${cc} -O3 -o run run_ref.c -lm` };
    if (r.error === undefined) console.log(`${cc} failed on run_ref.c: ${r.stderr.trim()}`);
  }
  return null;
}

function runReference(exe: string, path: string, steps: number): { tokens: number[]; tokensPerSec: number } {
  const r = spawnSync(exe, [path, String(steps), "1"], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`run_ref exited ${r.status}: ${r.stderr}`);
  const toks = /^tokens:(.*)$/m.exec(r.stdout);
  const rate = /^tok\/s: ([0-9.]+)$/m.exec(r.stdout);
  if (toks === null || rate === null) throw new Error(`run_ref printed no tokens or rate: ${r.stdout.slice(0, 200)}`);
  return { tokens: toks[1]!.trim().split(/\s+/).map(Number), tokensPerSec: Number(rate[1]) };
}

/** Greedy from token 1 at batch 1, timed like run.c: from the end of the first step to the end of the last. */
function runOurs(m: Transformer, steps: number): { tokens: number[]; tokensPerSec: number } {
  const cfg = m.cfg;
  const pool = new KvPool(kvShapeOf(cfg, BLOCK), Math.ceil(steps / BLOCK));
  const table = pool.allocate(Math.ceil(steps / BLOCK))!;
  const out = new Float32Array(cfg.vocabSize);
  const chunk = { blockTable: table, startPos: 0, tokens: [1] };
  const tokens: number[] = [];
  let start = 0;
  for (let pos = 0; pos < steps; pos++) {
    chunk.startPos = pos;
    m.forward(pool, [chunk], out);
    let next = 0;
    for (let i = 1; i < cfg.vocabSize; i++) if (out[i]! > out[next]!) next = i;
    tokens.push(next);
    chunk.tokens[0] = next;
    if (pos === 0) start = performance.now();
  }
  return { tokens, tokensPerSec: ((steps - 1) / (performance.now() - start)) * 1000 };
}

/**
 * The C reference and ours on the same checkpoint file, two alternating rounds, the better of
 * each kept: load on the shared machine then hits both alike.
 */
function versusC(ref: Reference, path: string, m: Transformer, steps: number, decode: Record<string, Phase>): VersusC {
  runOurs(m, 16);
  let c = runReference(ref.exe, path, steps);
  let ours = runOurs(m, steps);
  const c2 = runReference(ref.exe, path, steps);
  const ours2 = runOurs(m, steps);
  if (c2.tokensPerSec > c.tokensPerSec) c = c2;
  if (ours2.tokensPerSec > ours.tokensPerSec) ours = ours2;
  let prefixMatch = 0;
  while (prefixMatch < steps && c.tokens[prefixMatch] === ours.tokens[prefixMatch]) prefixMatch++;
  const matches = c.tokens.filter((t, i) => t === ours.tokens[i]).length;
  return {
    steps,
    cTokensPerSec: c.tokensPerSec,
    oursTokensPerSec: ours.tokensPerSec,
    ratio: ours.tokensPerSec / c.tokensPerSec,
    decodeBatch1VsC: decode.batch1!.tokensPerSec / c.tokensPerSec,
    decodeBatch8VsC: decode.batch8!.tokensPerSec / c.tokensPerSec,
    prefixMatch,
    matches,
    cTokens: c.tokens,
    oursTokens: ours.tokens,
  };
}

const naive1 = matmulGflops(matmulRef, 1, 256, 768);
const simd = placedKernel();
const tiled1 = matmulGflops(simd, 1, 256, 768);
const tiled64 = matmulGflops(simd, 64, 256, 768);
console.log(`baseline plain JS matmul (1x256 by 768x256): ${naive1.toFixed(2)} GFLOP/s`);
console.log(
  `SIMD matmul: rows=1 ${tiled1.toFixed(2)} GFLOP/s (${(tiled1 / naive1).toFixed(2)}x), rows=64 ${tiled64.toFixed(2)} GFLOP/s (${(tiled64 / naive1).toFixed(2)}x)`,
);

const t0 = performance.now();
const syn = loadSyntheticModel();
new Transformer(syn.cfg, syn.weights);
const startupMs = performance.now() - t0;
console.log(`tl-synthetic-4l load + construct: ${startupMs.toFixed(1)} ms`);

const dir = mkdtempSync(join(tmpdir(), "tl-bench-model-"));
type ModelResult = ReturnType<typeof benchModel> & { versusC?: VersusC };
const results: ModelResult[] = [];
let compiler = "none: no gcc or cc, run.c comparison skipped";
try {
  const ref = buildReference(dir);
  if (ref === null) console.log("no C compiler (gcc or cc): skipping the run.c comparison");
  else compiler = ref.compiler;
  // Both models go through a llama2.c file, so the C reference reads exactly what we run.
  const compare = (r: ModelResult, path: string, m: Transformer, steps: number): void => {
    if (ref !== null) r.versusC = versusC(ref, path, m, steps, r.decode);
  };

  const synPath = join(dir, "synthetic.bin");
  writeLlama2cCheckpoint(synPath, syn.cfg, syn.weights, false);
  const synResult: ModelResult = benchModel(syn.cfg, syn.weights, 512);
  results.push(synResult);
  compare(synResult, synPath, new Transformer(syn.cfg, syn.weights), 256);

  const ts: ModelConfig = {
    name: "tinystories-15m-shape",
    dim: 288,
    hiddenDim: 768,
    nLayers: 6,
    nHeads: 6,
    nKvHeads: 6,
    vocabSize: 32000,
    maxSeqLen: 256,
    ropeTheta: 10000,
    normEps: 1e-5,
  };
  const path = join(dir, "stories15M.bin");
  writeLlama2cCheckpoint(path, ts, syntheticWeights(ts, 15, { sharedClassifier: true }), true);
  const t1 = performance.now();
  const loaded = loadLlama2cCheckpoint(path);
  const loadMs = performance.now() - t1;
  console.log(`llama2.c checkpoint load (${ts.name}): ${loadMs.toFixed(1)} ms`);
  // TinyStories' seq_len is 256: prefill what fits, and the C comparison decodes all of it.
  const tsResult: ModelResult = benchModel({ ...loaded.cfg, name: ts.name }, loaded.weights, 256);
  results.push(tsResult);
  compare(tsResult, path, new Transformer(loaded.cfg, loaded.weights), ts.maxSeqLen);
} finally {
  rmSync(dir, { recursive: true, force: true });
}

for (const r of results) {
  const fmt = (p: Phase) =>
    `${p.tokensPerSec.toFixed(1)} tok/s, ${p.gflops.toFixed(2)} GFLOP/s, ${p.vsPlainJsMatmul.toFixed(2)}x plain JS matmul (${p.plainJsMatmulGflops.toFixed(2)} GFLOP/s)`;
  console.log(`${r.name}: prefill ${r.prefillLen}: ${fmt(r.prefill)}`);
  for (const [k, p] of Object.entries(r.decode)) console.log(`${r.name}: decode ${k}: ${fmt(p)}`);
  const v = r.versusC;
  if (v !== undefined) {
    console.log(
      `${r.name}: vs C run.c-style reference (${compiler}), ${v.steps} greedy steps at batch 1: ` +
        `C ${v.cTokensPerSec.toFixed(1)} tok/s, ours ${v.oursTokensPerSec.toFixed(1)} tok/s, ratio ${v.ratio.toFixed(2)}x (target >= 0.5x); ` +
        `decode phases over C: batch1 ${v.decodeBatch1VsC.toFixed(2)}x, batch8 ${v.decodeBatch8VsC.toFixed(2)}x; ` +
        `greedy tokens: first ${v.prefixMatch} identical, ${v.matches}/${v.steps} agree`,
    );
  }
}

mkdirSync(join(import.meta.dir, "results"), { recursive: true });
writeFileSync(
  join(import.meta.dir, "results", "model.json"),
  JSON.stringify(
    {
      bench: "model",
      baseline: { plainJsMatmulGflops: naive1, simdMatmulGflopsRows1: tiled1, simdMatmulGflopsRows64: tiled64 },
      syntheticStartupMs: startupMs,
      models: results,
      cReference: compiler,
    },
    null,
    2,
  ) + "\n",
);
