// q4_k and q6_k (the two halves of a Q4_K_M file) and q5_k against q8_0, on one synthetic model in each
// dtype, all measured in this run in alternating rounds: batch-1 decode tok/s with the GB/s of
// weight reads it achieves (every matrix but the embedding is read once per token), and a
// 512-token prefill's tok/s. The ratio printed is each dtype's median over q8_0's median.
//
//   bun bench/k-quants.ts            (BENCH_THREADS: default all cores; BENCH_ROUNDS: default 5;
//                                     BENCH_SHAPE=small for a quick run)
//
// Results in bench/results/k-quants.json, with the CPU and the load average.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { castWeights, syntheticWeights, MATRICES } from "../src/model/compute/weights.ts";
import { type DType, kvShapeOf, type ModelConfig, Transformer } from "../src/model/index.ts";
import type { KvPool } from "../src/pool/index.ts";
import { heldBytesOf } from "../src/model/compute/packed.ts";
import { loadAverage, median } from "./stats.ts";

/** A Llama-like shape between TinyStories and 1B (K-quant rows are whole 256-blocks): ~100M parameters. */
const SHAPES: Record<string, ModelConfig> = {
  mid: { name: "kq-mid", dim: 1024, hiddenDim: 2816, nLayers: 8, nHeads: 16, nKvHeads: 4, vocabSize: 16384, maxSeqLen: 1024, ropeTheta: 10000, normEps: 1e-5 },
  small: { name: "kq-small", dim: 512, hiddenDim: 1536, nLayers: 4, nHeads: 8, nKvHeads: 4, vocabSize: 4096, maxSeqLen: 1024, ropeTheta: 10000, normEps: 1e-5 },
};
const cfg = SHAPES[process.env.BENCH_SHAPE ?? "mid"]!;
const THREADS = Number(process.env.BENCH_THREADS ?? availableParallelism());
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const DTYPES: DType[] = ["q8_0", "q4_k", "q5_k", "q6_k"];
const BLOCK = 16;
const PREFILL = 512;
const DECODE_STEPS = 32;

interface Model {
  dtype: DType;
  m: Transformer;
  weightBytes: number;
  /** Enough blocks for the prefill, made once (a pool's slab is never freed from the kernel memory). */
  pool: KvPool;
}

function build(): Model[] {
  const f32 = syntheticWeights(cfg, 7);
  return DTYPES.map((dtype) => {
    const t0 = performance.now();
    const w = castWeights(cfg, f32, dtype);
    let weightBytes = 0;
    for (const k of MATRICES) if (k !== "tokenEmbedding") weightBytes += heldBytesOf(w[k]);
    const m = new Transformer(cfg, w, { threads: THREADS });
    const pool = m.kvPool(kvShapeOf(cfg, BLOCK), Math.ceil(PREFILL / BLOCK));
    console.log(
      `${dtype}: quantized and placed in ${((performance.now() - t0) / 1000).toFixed(1)} s, ${(weightBytes / 2 ** 20).toFixed(1)} MiB of matrices read per token`,
    );
    return { dtype, m, weightBytes, pool };
  });
}

/** One prefill of PREFILL tokens (ms). */
function prefillMs({ m, pool }: Model): number {
  const table = pool.allocate(Math.ceil(PREFILL / BLOCK))!;
  const prompt = Array.from({ length: PREFILL }, (_, i) => (i * 7919 + 13) % cfg.vocabSize);
  const out = new Float32Array(cfg.vocabSize);
  const t0 = performance.now();
  m.forward(pool, [{ blockTable: table, startPos: 0, tokens: prompt }], out);
  const ms = performance.now() - t0;
  pool.releaseAll(table);
  return ms;
}

/** DECODE_STEPS greedy batch-1 steps after a 16-token prompt (ms per token). */
function decodeMsPerToken({ m, pool }: Model): number {
  const table = pool.allocate(Math.ceil((16 + DECODE_STEPS) / BLOCK))!;
  const out = new Float32Array(cfg.vocabSize);
  m.forward(pool, [{ blockTable: table, startPos: 0, tokens: Array.from({ length: 16 }, (_, i) => i + 1) }], out);
  let tok = 1;
  const t0 = performance.now();
  for (let i = 0; i < DECODE_STEPS; i++) {
    m.forward(pool, [{ blockTable: table, startPos: 16 + i, tokens: [tok] }], out);
    tok = 0;
    for (let j = 1; j < cfg.vocabSize; j++) if (out[j]! > out[tok]!) tok = j;
  }
  const ms = (performance.now() - t0) / DECODE_STEPS;
  pool.releaseAll(table);
  return ms;
}

async function main(): Promise<void> {
  const cpu = /model name\s*:\s*(.*)/.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "unknown";
  console.log(
    `${cfg.name}: dim ${cfg.dim}, hidden ${cfg.hiddenDim}, ${cfg.nLayers} layers, vocab ${cfg.vocabSize}; ${THREADS} threads; ${cpu}; load ${loadAverage()}`,
  );
  const models = build();
  await Promise.all(models.map((x) => x.m.ready()));
  const decode: Record<string, number[]> = {};
  const prefill: Record<string, number[]> = {};
  for (const x of models) {
    decodeMsPerToken(x); // warm-up
    prefillMs(x);
    decode[x.dtype] = [];
    prefill[x.dtype] = [];
  }
  const loads: string[] = [loadAverage()];
  for (let r = 0; r < ROUNDS; r++) {
    // Alternating: every dtype once per round, the order rotating, so the machine's swings reach all.
    for (let i = 0; i < models.length; i++) {
      const x = models[(i + r) % models.length]!;
      decode[x.dtype]!.push(decodeMsPerToken(x));
      prefill[x.dtype]!.push(prefillMs(x));
    }
    loads.push(loadAverage());
  }
  const base = models[0]!.dtype;
  const result: Record<string, unknown> = {};
  for (const x of models) {
    const dms = median(decode[x.dtype]!);
    const pms = median(prefill[x.dtype]!);
    const row = {
      decodeTokensPerSec: 1000 / dms,
      decodeWeightGBps: x.weightBytes / dms / 1e6,
      prefill512TokensPerSec: (PREFILL / pms) * 1000,
      decodeOverQ8: median(decode[base]!) / dms,
      prefillOverQ8: median(prefill[base]!) / pms,
      matrixMiB: x.weightBytes / 2 ** 20,
    };
    result[x.dtype] = row;
    console.log(
      `${x.dtype.padEnd(5)} decode ${row.decodeTokensPerSec.toFixed(1)} tok/s (${row.decodeWeightGBps.toFixed(2)} GB/s of weights, ${row.decodeOverQ8.toFixed(2)}x q8_0)` +
        `  prefill-512 ${row.prefill512TokensPerSec.toFixed(1)} tok/s (${row.prefillOverQ8.toFixed(2)}x q8_0)`,
    );
  }
  console.log(`load during the rounds: ${loads.join(" | ")}`);
  for (const x of models) x.m.close();
  mkdirSync(join(import.meta.dir, "results"), { recursive: true });
  const out = { shape: cfg, threads: THREADS, rounds: ROUNDS, cpu, loads, results: result, at: new Date().toISOString() };
  writeFileSync(join(import.meta.dir, "results", "k-quants.json"), `${JSON.stringify(out, null, 2)}\n`);
}

await main();
