// Model throughput: prefill (one 512-token chunk) and batched decode, for the embedded
// tl-synthetic-4l and a llama2.c checkpoint of TinyStories-15M shape with random weights.
// Baseline measured in the same run: the naive one-output-at-a-time matmul in GFLOP/s, re-timed
// right before each phase (the machine is shared, so a single early baseline drifts); each phase
// reports its effective matmul GFLOP/s (attention excluded) and the ratio to that baseline.
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
import { matmul, matmulNaive } from "../src/model/matmul.ts";

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

function matmulGflops(kernel: typeof matmul, rows: number, n: number, d: number, minMs = 400): number {
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
  naiveMatmulGflops: number;
  vsNaiveMatmul: number;
}

const naiveBaseline = (): number => matmulGflops(matmulNaive, 1, 256, 768, 300);

function benchModel(cfg: ModelConfig, weights: Weights, prefillLen: number) {
  const m = new Transformer(cfg, weights);
  const f = flopsPerToken(cfg);
  const phase = (tokens: number, ms: number, flops: number, naive: number): Phase => {
    const gflops = flops / ms / 1e6;
    return { tokensPerSec: (tokens / ms) * 1000, gflops, naiveMatmulGflops: naive, vsNaiveMatmul: gflops / naive };
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

const naive1 = matmulGflops(matmulNaive, 1, 256, 768);
const tiled1 = matmulGflops(matmul, 1, 256, 768);
const tiled64 = matmulGflops(matmul, 64, 256, 768);
console.log(`baseline naive matmul (1x256 by 768x256): ${naive1.toFixed(2)} GFLOP/s`);
console.log(`tiled matmul: rows=1 ${tiled1.toFixed(2)} GFLOP/s (${(tiled1 / naive1).toFixed(2)}x), rows=64 ${tiled64.toFixed(2)} GFLOP/s (${(tiled64 / naive1).toFixed(2)}x)`);

const t0 = performance.now();
const syn = loadSyntheticModel();
new Transformer(syn.cfg, syn.weights);
const startupMs = performance.now() - t0;
console.log(`tl-synthetic-4l load + construct: ${startupMs.toFixed(1)} ms`);

const dir = mkdtempSync(join(tmpdir(), "tl-bench-model-"));
const results: unknown[] = [];
try {
  results.push(benchModel(syn.cfg, syn.weights, 512));
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
  // TinyStories' seq_len is 256: prefill what fits.
  results.push(benchModel({ ...loaded.cfg, name: ts.name }, loaded.weights, 256));
} finally {
  rmSync(dir, { recursive: true, force: true });
}

for (const r of results as ReturnType<typeof benchModel>[]) {
  const fmt = (p: Phase) =>
    `${p.tokensPerSec.toFixed(1)} tok/s, ${p.gflops.toFixed(2)} GFLOP/s, ${p.vsNaiveMatmul.toFixed(2)}x naive matmul (${p.naiveMatmulGflops.toFixed(2)} GFLOP/s)`;
  console.log(`${r.name}: prefill ${r.prefillLen}: ${fmt(r.prefill)}`);
  for (const [k, p] of Object.entries(r.decode)) console.log(`${r.name}: decode ${k}: ${fmt(p)}`);
}

mkdirSync(join(import.meta.dir, "results"), { recursive: true });
writeFileSync(
  join(import.meta.dir, "results", "model.json"),
  JSON.stringify(
    {
      bench: "model",
      baseline: { naiveMatmulGflops: naive1, tiledMatmulGflopsRows1: tiled1, tiledMatmulGflopsRows64: tiled64 },
      syntheticStartupMs: startupMs,
      models: results,
    },
    null,
    2,
  ) + "\n",
);
