// Token tiles (kernel-threads.ts' TILE_X_BYTES, kernels/assembly/dispatch.ts) against none, on a
// 1B-like shape (Llama-3.2-1B's dim 2048, hidden 8192, 32 heads over 8 KV heads; 2 layers and a
// small vocabulary, since the matrices' shapes are what the tiles change): a 512-token prefill,
// and a batch-8 decode step (8 token rows, which no tile splits), for q4_k, q6_k, q8_0 and f16. The
// same model runs both ways in alternating rounds, the order flipping each round; the ratio is
// the median without tiles over the median with (above 1: the tiles are faster), in wall time and
// in the process's CPU time over all threads (which other processes' preemption leaves out: on a
// shared machine the steadier of the two).
//
//   bun bench/prefill-tiles.ts    (BENCH_THREADS: default all cores; BENCH_ROUNDS: default 5;
//                                  BENCH_DTYPES: default q4_k,q6_k,q8_0,f16; BENCH_TILE_X and
//                                  BENCH_TILE_W: the tile's x bytes and a chunk's weight bytes)
//
// Results in bench/results/prefill-tiles.json, with the CPU and the load average.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import type { Tiles } from "../src/model/compute/kernel-threads.ts";
import { MatmulKernel } from "../src/model/compute/matmul.ts";
import { castMatrix } from "../src/model/compute/packed.ts";
import { castWeights, syntheticWeights } from "../src/model/compute/weights.ts";
import { type DType, kvShapeOf, type ModelConfig, Transformer } from "../src/model/index.ts";
import type { KvPool } from "../src/pool/index.ts";
import { loadAverage, median } from "./stats.ts";

const cfg: ModelConfig = {
  name: "1b-like-2-layers",
  dim: 2048,
  hiddenDim: 8192,
  nLayers: 2,
  nHeads: 32,
  nKvHeads: 8,
  vocabSize: 4096,
  maxSeqLen: 1024,
  ropeTheta: 500000,
  normEps: 1e-5,
};
const THREADS = Number(process.env.BENCH_THREADS ?? availableParallelism());
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const DTYPES = (process.env.BENCH_DTYPES ?? "q4_k,q6_k,q8_0,f16").split(",") as DType[];
const BLOCK = 16;
const PREFILL = 512;
const BATCH = 8;
const DECODE_STEPS = 8;
const MATMUL_REPS = Number(process.env.BENCH_MATMUL_REPS ?? 9);
/** BENCH_ONLY=matmuls: the matmuls alone, not the model. */
const ONLY = process.env.BENCH_ONLY ?? "";

interface Model {
  dtype: DType;
  m: Transformer;
  tiles: Tiles;
  pool: KvPool;
}

function build(f32: ReturnType<typeof syntheticWeights>, dtype: DType): Model {
  const t0 = performance.now();
  const m = new Transformer(cfg, castWeights(cfg, f32, dtype), { threads: THREADS });
  // The model's own kernel, reached to switch the tiles (one layer group at this size).
  const tiles = setTiles((m as unknown as { g: { mm: MatmulKernel } }).g.mm.tiles);
  const pool = m.kvPool(kvShapeOf(cfg, BLOCK), Math.ceil(PREFILL / BLOCK) + BATCH * 2);
  console.log(`${dtype}: placed in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  return { dtype, m, tiles, pool };
}

/** The tiles' sizes from BENCH_TILE_X and BENCH_TILE_W where given. */
function setTiles(tiles: Tiles): Tiles {
  if (process.env.BENCH_TILE_X) tiles.xBytes = Number(process.env.BENCH_TILE_X);
  if (process.env.BENCH_TILE_W) tiles.wBytes = Number(process.env.BENCH_TILE_W);
  return tiles;
}

/** One prefill of PREFILL tokens: wall ms, and the process's CPU ms over all its threads. */
function prefillMs({ m, pool }: Model): { ms: number; cpuMs: number } {
  const table = pool.allocate(Math.ceil(PREFILL / BLOCK))!;
  const prompt = Array.from({ length: PREFILL }, (_, i) => (i * 7919 + 13) % cfg.vocabSize);
  const out = new Float32Array(cfg.vocabSize);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  m.forward(pool, [{ blockTable: table, startPos: 0, tokens: prompt }], out);
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  pool.releaseAll(table);
  return { ms, cpuMs: (c.user + c.system) / 1000 };
}

/** DECODE_STEPS steps of BATCH sequences of one token each after a 4-token prompt: wall and CPU ms per step. */
function batchStepMs({ m, pool }: Model): { ms: number; cpuMs: number } {
  const tables = Array.from({ length: BATCH }, () => pool.allocate(1)!);
  const out = new Float32Array(cfg.vocabSize * BATCH);
  m.forward(
    pool,
    tables.map((blockTable, s) => ({ blockTable, startPos: 0, tokens: [s + 1, s + 2, s + 3, s + 4] })),
    out,
  );
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < DECODE_STEPS; i++) {
    m.forward(
      pool,
      tables.map((blockTable, s) => ({ blockTable, startPos: 4 + i, tokens: [(s * 31 + i) % cfg.vocabSize] })),
      out,
    );
  }
  const ms = (performance.now() - t0) / DECODE_STEPS;
  const c = process.cpuUsage(c0);
  for (const t of tables) pool.releaseAll(t);
  return { ms, cpuMs: (c.user + c.system) / 1000 / DECODE_STEPS };
}

/**
 * The prefill's three matmul shapes alone (dim -> dim, dim -> hidden, hidden -> dim), 512 token
 * rows each, tiles off and on alternating MATMUL_REPS times: the minimum of each (ms, and the
 * process's CPU ms over all threads), which a shared machine's swings disturb least.
 */
type MatmulRow = { offMs: number; onMs: number; onOverOff: number; offCpuMs: number; onCpuMs: number; cpuOnOverOff: number };
async function matmuls(dtype: DType): Promise<Record<string, MatmulRow>> {
  const shapes = [
    { name: `${cfg.dim}x${cfg.dim}`, d: cfg.dim, n: cfg.dim },
    { name: `${cfg.hiddenDim}x${cfg.dim}`, d: cfg.hiddenDim, n: cfg.dim },
    { name: `${cfg.dim}x${cfg.hiddenDim}`, d: cfg.dim, n: cfg.hiddenDim },
  ];
  const mats = shapes.map((s, i) =>
    castMatrix(
      new Float32Array(s.d * s.n).map((_, j) => Math.sin(j * 0.37 + i) * 0.05),
      dtype,
      s.n,
    ),
  );
  const k = new MatmulKernel(
    mats.map((matrix, i) => ({ matrix, cols: shapes[i]!.n })),
    { threads: THREADS },
  );
  const out: Record<string, MatmulRow> = {};
  try {
    await k.ready();
    const tiles = setTiles(k.tiles);
    shapes.forEach((s, i) => {
      const x = k.alloc(PREFILL * s.n).map((_, j) => Math.cos(j * 0.13));
      const y = k.alloc(PREFILL * s.d);
      const best = { off: Infinity, on: Infinity };
      const cpu = { off: Infinity, on: Infinity };
      for (let r = 0; r < MATMUL_REPS; r++) {
        for (const on of r % 2 === 0 ? [false, true] : [true, false]) {
          tiles.on = on;
          const k0 = on ? "on" : "off";
          const c0 = process.cpuUsage();
          const t0 = performance.now();
          k.matmul(y, x, k.views[i]!, 0, PREFILL, s.n, s.d);
          const ms = performance.now() - t0;
          const c = process.cpuUsage(c0);
          if (r === 0) continue;
          best[k0] = Math.min(best[k0], ms);
          // Every thread's CPU time (the process's): what a shared machine's preemption leaves out.
          cpu[k0] = Math.min(cpu[k0], (c.user + c.system) / 1000);
        }
      }
      out[s.name] = { offMs: best.off, onMs: best.on, onOverOff: best.off / best.on, offCpuMs: cpu.off, onCpuMs: cpu.on, cpuOnOverOff: cpu.off / cpu.on };
    });
  } finally {
    k.close();
  }
  console.log(
    `${dtype.padEnd(5)} matmuls x512 (min ms, off -> on): ` +
      Object.entries(out)
        .map(([name, v]) => `${name} ${v.offMs.toFixed(1)} -> ${v.onMs.toFixed(1)} (${v.onOverOff.toFixed(3)}x; cpu ${v.cpuOnOverOff.toFixed(3)}x)`)
        .join(", ") +
      `  load ${loadAverage()}`,
  );
  return out;
}

async function main(): Promise<void> {
  const cpuinfo = readFileSync("/proc/cpuinfo", "utf8");
  const cpu = /model name\s*:\s*(.*)/.exec(cpuinfo)?.[1] ?? "unknown";
  console.log(`${cfg.name}: dim ${cfg.dim}, hidden ${cfg.hiddenDim}, ${cfg.nLayers} layers; ${THREADS} threads; ${cpu}; load ${loadAverage()}`);
  const f32 = ONLY === "matmuls" ? syntheticWeights({ ...cfg, nLayers: 1, dim: 64, hiddenDim: 64, nHeads: 4, nKvHeads: 4 }, 7) : syntheticWeights(cfg, 7);
  const loads: string[] = [loadAverage()];
  const result: Record<string, unknown> = {};
  // One dtype at a time (its model alone in memory), both ways alternating within it.
  for (const dtype of DTYPES) {
    const mm = await matmuls(dtype);
    if (ONLY === "matmuls") {
      result[dtype] = { matmuls: mm };
      continue;
    }
    const x = build(f32, dtype);
    await x.m.ready();
    const prefill: Record<"off" | "on", number[]> = { off: [], on: [] };
    const prefillCpu: Record<"off" | "on", number[]> = { off: [], on: [] };
    const batch: Record<"off" | "on", number[]> = { off: [], on: [] };
    const batchCpu: Record<"off" | "on", number[]> = { off: [], on: [] };
    for (const on of [false, true]) {
      x.tiles.on = on;
      prefillMs(x); // warm-up
      batchStepMs(x);
    }
    for (let r = 0; r < ROUNDS; r++) {
      for (const on of r % 2 === 0 ? [false, true] : [true, false]) {
        x.tiles.on = on;
        const k = on ? "on" : "off";
        const p = prefillMs(x);
        prefill[k].push(p.ms);
        prefillCpu[k].push(p.cpuMs);
        const b = batchStepMs(x);
        batch[k].push(b.ms);
        batchCpu[k].push(b.cpuMs);
      }
      loads.push(loadAverage());
    }
    const row = {
      prefillTokensPerSecOff: (PREFILL / median(prefill.off)) * 1000,
      prefillTokensPerSecOn: (PREFILL / median(prefill.on)) * 1000,
      prefillOnOverOff: median(prefill.off) / median(prefill.on),
      prefillCpuOnOverOff: median(prefillCpu.off) / median(prefillCpu.on),
      batch8StepMsOff: median(batch.off),
      batch8StepMsOn: median(batch.on),
      batch8OnOverOff: median(batch.off) / median(batch.on),
      batch8CpuOnOverOff: median(batchCpu.off) / median(batchCpu.on),
      prefillMs: prefill,
      prefillCpuMs: prefillCpu,
      batch8StepMs: batch,
      batch8StepCpuMs: batchCpu,
      matmuls: mm,
    };
    result[dtype] = row;
    console.log(
      `${dtype.padEnd(5)} prefill-512 ${row.prefillTokensPerSecOff.toFixed(1)} -> ${row.prefillTokensPerSecOn.toFixed(1)} tok/s (${row.prefillOnOverOff.toFixed(3)}x; cpu ${row.prefillCpuOnOverOff.toFixed(3)}x)` +
        `  batch-8 step ${row.batch8StepMsOff.toFixed(1)} -> ${row.batch8StepMsOn.toFixed(1)} ms (${row.batch8OnOverOff.toFixed(3)}x; cpu ${row.batch8CpuOnOverOff.toFixed(3)}x)  load ${loadAverage()}`,
    );
    x.m.close();
  }
  console.log(`load during the rounds: ${loads.join(" | ")}`);
  mkdirSync(join(import.meta.dir, "results"), { recursive: true });
  const tile = { xBytes: process.env.BENCH_TILE_X ?? "default", wBytes: process.env.BENCH_TILE_W ?? "default" };
  const out = { shape: cfg, threads: THREADS, tile, rounds: ROUNDS, cpu, loads, results: result, at: new Date().toISOString() };
  const file = process.env.BENCH_OUT ?? "prefill-tiles.json";
  writeFileSync(join(import.meta.dir, "results", file), `${JSON.stringify(out, null, 2)}\n`);
}

await main();
