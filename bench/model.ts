// Model throughput against llama2.c's own ways of being fast, all measured in this run:
// - bench/c/run_ref.c (run.c's forward, with run.c's OpenMP pragmas) built as `make run`
//   (gcc -O3) and as `make runomp` (gcc -Ofast -fopenmp -march=native, OMP_NUM_THREADS = all
//   cores), decoding a TinyStories-15M-shape llama2.c file greedily from BOS at batch 1; ours on
//   the same file in each weight dtype (f32, f16, bf16, q8_0) on all cores, with the achieved GB/s
//   of weight reads (every matrix is read once per token at batch 1);
// - batch-8 decode against our own batch-1, beside what batch 8 buys run_ref.c's loop (its BATCH:
//   runomp, and runomp built for x86-64-v2, 128-bit vectors without FMA as WebAssembly SIMD has);
// - a 512-token prefill's matmul GFLOP/s against numpy (OpenBLAS sgemm, all cores) on the same
//   shapes, where numpy imports;
// - `engine generate`'s loop (Engine.step around the same model) against the transformer alone,
//   and the event loop's delay p99 while that engine prefills 512 tokens and decodes at batch 32,
//   with the model on the event loop's thread and on a model thread of its own (ModelWorker, as
//   engines run it; bench/engine-loop.ts);
// - greedy tokens of each packed dtype against f32 for 64 steps on the test prompts.
// The plain JS matmul (matmulRef) and the SIMD kernel alone are the micro baselines.
import { spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { batchBuilds, buildReferences, cBatchRound, cBatchSummary, runcBuilds, runReference, type Reference } from "./c-reference.ts";
import { enginePart } from "./engine-loop.ts";
import { loadAverage, median } from "./stats.ts";
import { type DType, type ModelConfig, Transformer, kvShapeOf, loadLlama2cCheckpoint } from "../src/model/index.ts";
import { type Matrix, heldBytesOf } from "../src/model/compute/packed.ts";
import { type Weights, castWeights, syntheticWeights, MATRICES } from "../src/model/compute/weights.ts";
import { kvDimOf } from "../src/model/compute/config.ts";
import { writeLlama2cCheckpoint } from "../src/model/load/llama2c.ts";
import { MatmulKernel, matmulRef } from "../src/model/compute/matmul.ts";
import { FORWARD_PHASES } from "../src/model/compute/transformer.ts";
import { TS_SHAPE } from "./ts-shape.ts";

const BLOCK = 16;
const CORES = availableParallelism();
const THREADS = Number(process.env.BENCH_THREADS ?? CORES);
const DTYPES: DType[] = ["f32", "f16", "bf16", "q8_0"];

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

/** FLOPs per token in the layer matmuls (attention scores excluded), and the classifier's. */
function flopsPerToken(cfg: ModelConfig): { layers: number; cls: number } {
  const kv = kvDimOf(cfg);
  const perLayer = cfg.dim * cfg.dim * 2 + 2 * kv * cfg.dim + 3 * cfg.dim * cfg.hiddenDim;
  return { layers: 2 * cfg.nLayers * perLayer, cls: 2 * cfg.vocabSize * cfg.dim };
}

/** Bytes of matrix weights one batch-1 token reads (every layer matrix and the classifier). */
function weightBytesPerToken(cfg: ModelConfig, w: Weights<Matrix>): number {
  let bytes = 0;
  for (const k of MATRICES) if (k !== "tokenEmbedding") bytes += heldBytesOf(w[k]);
  void cfg;
  return bytes;
}

interface Phase {
  tokensPerSec: number;
  gflops: number;
}

/** Rounds of batch-1 and batch-8 decode, alternating, so the machine's swings move both sides of a round's ratio. */
const DECODE_ROUNDS = 7;

/**
 * Prefill of `prefillLen` tokens, and decode at batch 1 and 8 over a 64-token context: each
 * batch's tok/s is its median round, and batch8OverBatch1 the median of the rounds' ratios.
 */
function benchPhases(m: Transformer, prefillLen: number, eachRound?: () => void): { prefill: Phase; decode: Record<string, Phase>; batch8OverBatch1: number } {
  const cfg = m.cfg;
  const f = flopsPerToken(cfg);
  const phase = (tokens: number, ms: number, flops: number): Phase => ({ tokensPerSec: (tokens / ms) * 1000, gflops: flops / ms / 1e6 });
  const blocks = Math.ceil(prefillLen / BLOCK);
  const pool = m.kvPool(kvShapeOf(cfg, BLOCK), blocks);
  const table = pool.allocate(blocks)!;
  const prompt = Array.from({ length: prefillLen }, (_, i) => (i * 7919 + 13) % cfg.vocabSize);
  const out = new Float32Array(8 * cfg.vocabSize);
  const prefillMs = timeIt(() => m.forward(pool, [{ blockTable: table, startPos: 0, tokens: prompt }], out), 1500);
  const prefill = phase(prefillLen, prefillMs, prefillLen * f.layers + f.cls);
  return { prefill, ...batchDecode(m, prompt, out, eachRound) };
}

/**
 * Decode at batch 1 and 8 in DECODE_ROUNDS alternating rounds (see benchPhases), from `prompt`'s
 * first tokens; `eachRound` (C's round, when set) runs after each, so the machine's swings reach both.
 */
function batchDecode(m: Transformer, prompt: number[], out: Float32Array, eachRound?: () => void): { decode: Record<string, Phase>; batch8OverBatch1: number } {
  const f = flopsPerToken(m.cfg);
  const steppers = [1, 8].map((batch) => decodeStepper(m, prompt, batch, out));
  const ms: number[][] = [[], []];
  for (let r = 0; r < DECODE_ROUNDS; r++) {
    for (let b = 0; b < 2; b++) ms[b]!.push(timeIt(steppers[b]!, 300));
    eachRound?.();
  }
  const decode: Record<string, Phase> = {};
  [1, 8].forEach((batch, b) => {
    const msStep = median(ms[b]!);
    decode[`batch${batch}`] = { tokensPerSec: (batch / msStep) * 1000, gflops: (batch * (f.layers + f.cls)) / msStep / 1e6 };
  });
  // tok/s at batch 8 over batch 1 in a round = 8 ms1 / ms8.
  const batch8OverBatch1 = median(ms[0]!.map((ms1, r) => (8 * ms1) / ms[1]![r]!));
  return { decode, batch8OverBatch1 };
}

/**
 * Our f32 batch-8 rounds (batchDecode) with C's between them (cBatchRound: runomp, and runomp held
 * to WebAssembly SIMD's instruction set) on the checkpoint at path, printed side by side.
 */
function f32BatchVsC<T extends { decode: Record<string, Phase>; batch8OverBatch1: number }>(
  dir: string,
  path: string,
  run: (eachRound: () => void) => T,
): { ours: T; c: Record<string, unknown> } {
  const refs = buildReferences(dir, batchBuilds(CORES));
  const rounds: ReturnType<typeof cBatchRound>[] = [];
  const ours = run(() => rounds.push(cBatchRound(refs, path)));
  const ours8 = ours.decode.batch8!.tokensPerSec;
  const c: Record<string, unknown> = {};
  for (const [name, r] of Object.entries(cBatchSummary(refs, rounds))) {
    c[name] = { ...r, oursF32Batch8OverIts: ours8 / r.batch8TokS };
    console.log(
      `C ${name}: batch1 ${r.batch1TokS.toFixed(1)} tok/s, batch8 ${r.batch8TokS.toFixed(1)} tok/s: ${r.batch8OverBatch1.toFixed(2)}x its batch 1 ` +
        `(${Math.min(...r.rounds).toFixed(2)}-${Math.max(...r.rounds).toFixed(2)}, median of ${DECODE_ROUNDS} rounds between ours; ours f32 ${ours.batch8OverBatch1.toFixed(2)}x); ` +
        `our f32 batch 8 is ${(ours8 / r.batch8TokS).toFixed(2)}x its batch 8`,
    );
  }
  return { ours, c };
}

/** One decode step of `batch` sequences over a 64-token context (prefilled here), cycling through 64 positions. */
function decodeStepper(m: Transformer, prompt: number[], batch: number, out: Float32Array): () => void {
  const cfg = m.cfg;
  const ctx = 64;
  const steps = 64;
  const perSeq = Math.ceil((ctx + steps) / BLOCK);
  const dp = m.kvPool(kvShapeOf(cfg, BLOCK), perSeq * batch);
  const tables = Array.from({ length: batch }, () => dp.allocate(perSeq)!);
  m.forward(
    dp,
    tables.map((t, s) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(s, s + ctx) })),
    out,
  );
  let pos = ctx;
  const chunks = tables.map((t) => ({ blockTable: t, startPos: 0, tokens: [0] }));
  return () => {
    for (let s = 0; s < batch; s++) {
      chunks[s]!.startPos = pos;
      chunks[s]!.tokens[0] = (pos * 31 + s) % cfg.vocabSize;
    }
    m.forward(dp, chunks, out);
    pos = pos + 1 >= ctx + steps ? ctx : pos + 1;
  };
}

/** Greedy from `first` at batch 1, timed like run.c: from the end of the first step to the end of the last. */
function runOurs(m: Transformer, steps: number, first = [1], keepLogits = false): { tokens: number[]; tokensPerSec: number; logits: Float32Array[] } {
  const cfg = m.cfg;
  const n = Math.ceil((steps + first.length) / BLOCK);
  const pool = m.kvPool(kvShapeOf(cfg, BLOCK), n);
  const table = pool.allocate(n)!;
  const out = new Float32Array(cfg.vocabSize);
  const chunk = { blockTable: table, startPos: 0, tokens: first.slice() };
  const tokens: number[] = [];
  const logits: Float32Array[] = [];
  let start = 0;
  for (let i = 0; i < steps; i++) {
    m.forward(pool, [chunk], out);
    if (keepLogits) logits.push(out.slice());
    let next = 0;
    for (let j = 1; j < cfg.vocabSize; j++) if (out[j]! > out[next]!) next = j;
    tokens.push(next);
    chunk.startPos += chunk.tokens.length;
    chunk.tokens = [next];
    if (i === 0) start = performance.now();
  }
  return { tokens, tokensPerSec: ((steps - 1) / (performance.now() - start)) * 1000, logits };
}

/** Rounds of batch-1 decode, run.c's builds then ours or ours then run.c's in turn (run (-O3), the slow one, in the first round only). */
const C_ROUNDS = 7;

type Decoded = { tokens: number[]; tokensPerSec: number };

/**
 * Batch-1 decode of every model against every C build in C_ROUNDS rounds, the two sides in
 * alternating order, so a swing of the machine moves both sides of a round's ratio: each side's
 * tok/s is its median round, each ratio its rounds' (ours over the C build of the same round).
 */
function batch1Rounds(
  refs: Reference[],
  path: string,
  models: Map<DType, Transformer>,
  steps: number,
): { c: Record<string, Decoded>; ours: Map<DType, Decoded>; ratios: Map<DType, Record<string, number[]>> } {
  for (const m of models.values()) runOurs(m, 16);
  const cRuns = new Map<string, Decoded[]>(refs.map((r) => [r.name, []]));
  const ourRuns = new Map<DType, Decoded[]>([...models.keys()].map((dt) => [dt, []]));
  const ratios = new Map<DType, Record<string, number[]>>([...models.keys()].map((dt) => [dt, Object.fromEntries(refs.map((r) => [r.name, []]))]));
  for (let round = 0; round < C_ROUNDS; round++) {
    const runC = (): Map<string, number> => {
      const rates = new Map<string, number>();
      for (const ref of round === 0 ? refs : refs.slice(1)) {
        const r = runReference(ref, path, steps);
        cRuns.get(ref.name)!.push(r);
        rates.set(ref.name, r.tokensPerSec);
      }
      return rates;
    };
    const runAll = (): Map<DType, number> => new Map([...models].map(([dt, m]) => [dt, pushed(ourRuns.get(dt)!, runOurs(m, steps)).tokensPerSec]));
    const cFirst = round % 2 === 0;
    const rates = cFirst ? runC() : null;
    const mine = runAll();
    const cRates = rates ?? runC();
    for (const [dt, tps] of mine) for (const [name, ctps] of cRates) ratios.get(dt)![name]!.push(tps / ctps);
  }
  const med = (runs: Decoded[]): Decoded => ({ tokens: runs[0]!.tokens, tokensPerSec: median(runs.map((r) => r.tokensPerSec)) });
  return {
    c: Object.fromEntries([...cRuns].map(([name, runs]) => [name, med(runs)])),
    ours: new Map([...ourRuns].map(([dt, runs]) => [dt, med(runs)])),
    ratios,
  };
}

function pushed<T>(list: T[], item: T): T {
  list.push(item);
  return item;
}

const prefixAgreement = (a: number[], b: number[]): number => {
  let i = 0;
  while (i < a.length && a[i] === b[i]) i++;
  return i;
};

/**
 * Our matmul GFLOP/s on the layer matmuls of a `rows`-token prefill, the shapes numpy runs: each
 * layer's q/k/v in one dispatch, wo, w1/w3 in one dispatch, w2, as Transformer.forward calls them.
 */
function oursPrefillMatmulGflops(cfg: ModelConfig, w: Weights<Matrix>, rows: number): number {
  const { dim, hiddenDim: hid, nLayers } = cfg;
  const kv = kvDimOf(cfg);
  const mm = new MatmulKernel(
    [
      { matrix: w.wq, cols: dim },
      { matrix: w.wk, cols: dim },
      { matrix: w.wv, cols: dim },
      { matrix: w.wo, cols: dim },
      { matrix: w.w1, cols: dim },
      { matrix: w.w2, cols: hid },
      { matrix: w.w3, cols: dim },
    ],
    { threads: THREADS },
  );
  const xb = mm.alloc(rows * dim).map((_, i) => Math.sin(i));
  const hb = mm.alloc(rows * hid).map((_, i) => Math.cos(i));
  const [q, k, v, o, h1, h3] = [dim, kv, kv, dim, hid, hid].map((d) => mm.alloc(rows * d));
  const once = (): void => {
    for (let l = 0; l < nLayers; l++) {
      mm.queue(q!, xb, w.wq, l * dim * dim, rows, dim, dim);
      mm.queue(k!, xb, w.wk, l * kv * dim, rows, dim, kv);
      mm.queue(v!, xb, w.wv, l * kv * dim, rows, dim, kv);
      mm.flush();
      mm.matmul(o!, xb, w.wo, l * dim * dim, rows, dim, dim);
      mm.queue(h1!, xb, w.w1, l * hid * dim, rows, dim, hid);
      mm.queue(h3!, xb, w.w3, l * hid * dim, rows, dim, hid);
      mm.flush();
      mm.matmul(o!, hb, w.w2, l * dim * hid, rows, hid, dim);
    }
  };
  const ms = timeIt(once, 1500);
  mm.close();
  const flops = 2 * rows * nLayers * (2 * dim * dim + 2 * kv * dim + 3 * dim * hid);
  return flops / ms / 1e6;
}

/**
 * numpy's float32 matmuls (OpenBLAS sgemm, all cores) over `rows` token rows of every layer's
 * shapes, and the classifier's when asked: GFLOP/s and rows a second; null where numpy does not import.
 */
function numpyMatmuls(cfg: ModelConfig, rows: number, classifier: boolean): { gflops: number; tokensPerSec: number } | null {
  const kv = kvDimOf(cfg);
  const shapes = [
    [cfg.dim, cfg.dim],
    [kv, cfg.dim],
    [kv, cfg.dim],
    [cfg.dim, cfg.dim],
    [cfg.hiddenDim, cfg.dim],
    [cfg.hiddenDim, cfg.dim],
    [cfg.dim, cfg.hiddenDim],
  ];
  const script = `
import numpy as np, time, json
rows, L, dim, shapes = ${rows}, ${cfg.nLayers}, ${cfg.dim}, ${JSON.stringify(shapes)}
cls = ${classifier ? JSON.stringify([cfg.vocabSize, cfg.dim]) : "None"}
ws = [[np.random.rand(d, n).astype(np.float32) for d, n in shapes] for _ in range(L)]
wc = None if cls is None else np.random.rand(*cls).astype(np.float32)
xs = {n: np.random.rand(rows, n).astype(np.float32) for _, n in shapes}
def once():
    for l in range(L):
        for (d, n), w in zip(shapes, ws[l]): xs[n] @ w.T
    if wc is not None: xs[dim] @ wc.T
once()
best = 1e9
for _ in range(7):
    t = time.perf_counter(); once(); best = min(best, time.perf_counter() - t)
flops = 2 * rows * (L * sum(d * n for d, n in shapes) + (0 if cls is None else cls[0] * cls[1]))
print(json.dumps([flops / best / 1e9, rows / best]))
`;
  // This machine's OpenBLAS tuning variables are for another core type: unset both for numpy only.
  const env = { ...process.env };
  delete env.OPENBLAS_CORETYPE;
  delete env.OPENBLAS_L2_SIZE;
  const r = spawnSync("python3", ["-c", script], { encoding: "utf8", env });
  // Only a missing python3 or numpy skips the comparison; any other failure is the script's own.
  if (r.error !== undefined || /No module named '?numpy/.test(r.stderr)) return null;
  if (r.status !== 0) throw new Error(`numpy matmul script exited ${r.status}: ${r.stderr.trim().slice(-400)}`);
  const [gflops, tokensPerSec] = JSON.parse(r.stdout.trim()) as [number, number];
  return { gflops, tokensPerSec };
}

/**
 * numpy's matmuls alone (every matrix, the classifier's too) at batch 1 and 8 in rounds: the batch
 * 8 a native sgemm with FMA reaches here, beside our whole step's. Null where numpy does not import.
 */
function numpyBatch(cfg: ModelConfig, oursBatch8: number): Record<string, number> | null {
  const runs: { b1: number; b8: number }[] = [];
  for (let r = 0; r < 3; r++) {
    const b1 = numpyMatmuls(cfg, 1, true);
    const b8 = numpyMatmuls(cfg, 8, true);
    if (b1 === null || b8 === null) return null;
    runs.push({ b1: b1.tokensPerSec, b8: b8.tokensPerSec });
  }
  const b8 = median(runs.map((r) => r.b8));
  const out = { matmulsBatch1TokS: median(runs.map((r) => r.b1)), matmulsBatch8TokS: b8, oursF32WholeStepBatch8OverIts: oursBatch8 / b8 };
  console.log(
    `numpy (OpenBLAS sgemm, all cores), the matmuls alone: batch1 ${out.matmulsBatch1TokS.toFixed(1)} tok/s, batch8 ${out.matmulsBatch8TokS.toFixed(1)} tok/s; ` +
      `our f32 batch 8, the whole step, is ${out.oursF32WholeStepBatch8OverIts.toFixed(2)}x its batch-8 matmuls`,
  );
  return out;
}

/** Prefill tok/s of `len` tokens, and each forward phase's share of the time (FORWARD_PHASES). */
function prefillProfile(m: Transformer, len: number): { tokensPerSec: number; share: Record<string, number>; msPerPrefill: Record<string, number> } {
  const blocks = Math.ceil(len / BLOCK);
  const pool = m.kvPool(kvShapeOf(m.cfg, BLOCK), blocks);
  const table = pool.allocate(blocks)!;
  const prompt = Array.from({ length: len }, (_, i) => (i * 7919 + 13) % m.cfg.vocabSize);
  const out = new Float32Array(m.cfg.vocabSize);
  const run = () => m.forward(pool, [{ blockTable: table, startPos: 0, tokens: prompt }], out);
  const ms = timeIt(run, 1500);
  const prof = new Float64Array(FORWARD_PHASES.length);
  m.profile = prof;
  let runs = 0;
  timeIt(() => {
    run();
    runs++;
  }, 1000);
  m.profile = null;
  const total = prof.reduce((a, b) => a + b, 0);
  return {
    tokensPerSec: (len / ms) * 1000,
    share: Object.fromEntries(FORWARD_PHASES.map((p, i) => [p, prof[i]! / total])),
    msPerPrefill: Object.fromEntries(FORWARD_PHASES.map((p, i) => [p, prof[i]! / runs])),
  };
}

// BENCH_ONLY=prefill: just the 512-token prefill of each dtype (BENCH_DTYPES, default f32,f16) on one
// thread and on BENCH_THREADS, with each forward phase's share (Transformer.profile), into
// results/model-prefill.json. Profile before this round's attention and elementwise kernels
// (f32, 1 thread, ms per prefill): matmul 215, attention 180, swiglu 38, kvWrite 20, residual 9.2,
// rmsnorm 3.0, rope 1.6; 1076 tok/s.
if (process.env.BENCH_ONLY === "prefill") {
  const loadBefore = loadAverage();
  const cfg: ModelConfig = { ...TS_SHAPE, maxSeqLen: 512 };
  const w = syntheticWeights(cfg, 15, { sharedClassifier: true });
  const dtypes = (process.env.BENCH_DTYPES ?? "f32,f16").split(",") as DType[];
  const rows: Record<string, unknown> = {};
  // One thread first: attention and the elementwise parts run on the caller alone, so their
  // share is clearest there; then all threads, as the engine runs.
  for (const threads of [...new Set([1, THREADS])]) {
    for (const dt of dtypes) {
      const m = new Transformer(cfg, castWeights(cfg, w, dt), { threads });
      await m.ready();
      const p = prefillProfile(m, 512);
      m.close();
      rows[`${dt}, ${threads} threads`] = p;
      const share = Object.entries(p.share)
        .map(([k, v]) => `${k} ${(v * 100).toFixed(1)}% (${p.msPerPrefill[k]!.toFixed(1)} ms)`)
        .join(", ");
      console.log(`${dt}: prefill 512 on ${threads} threads: ${p.tokensPerSec.toFixed(0)} tok/s; profile: ${share}`);
    }
  }
  const out = { bench: "model-prefill", cores: CORES, loadBefore, loadAfter: loadAverage(), rows };
  console.log(`load average before ${loadBefore}, after ${out.loadAfter} (${CORES} cores)`);
  mkdirSync(join(import.meta.dir, "results"), { recursive: true });
  writeFileSync(join(import.meta.dir, "results", "model-prefill.json"), JSON.stringify(out, null, 2) + "\n");
  process.exit(0);
}

// BENCH_ONLY=batch: just the batch-8 over batch-1 decode rounds (as the full run's phases) of each
// dtype (BENCH_DTYPES, default all four) on BENCH_THREADS, into results/model-batch.json.
if (process.env.BENCH_ONLY === "batch") {
  const loadBefore = loadAverage();
  const cfg: ModelConfig = { ...TS_SHAPE, maxSeqLen: 512 };
  const w = syntheticWeights(cfg, 15, { sharedClassifier: true });
  const dtypes = (process.env.BENCH_DTYPES ?? DTYPES.join(",")).split(",") as DType[];
  const prompt = Array.from({ length: 64 + 8 }, (_, i) => (i * 7919 + 13) % cfg.vocabSize);
  const rows: Record<string, unknown> = {};
  let c: Record<string, unknown> | null = null;
  for (const dt of dtypes) {
    const m = new Transformer(cfg, castWeights(cfg, w, dt), { threads: THREADS });
    await m.ready();
    let p: ReturnType<typeof batchDecode>;
    if (dt === "f32") {
      const dir = mkdtempSync(join(tmpdir(), "tl-bench-batch-"));
      const path = join(dir, "stories15M-512.bin");
      writeLlama2cCheckpoint(path, cfg, w, true);
      ({ ours: p, c } = f32BatchVsC(dir, path, (each) => batchDecode(m, prompt, new Float32Array(8 * cfg.vocabSize), each)));
      rmSync(dir, { recursive: true, force: true });
    } else p = batchDecode(m, prompt, new Float32Array(8 * cfg.vocabSize));
    m.close();
    rows[dt] = p;
    console.log(
      `${dt}, ${THREADS} threads: decode batch1 ${p.decode.batch1!.tokensPerSec.toFixed(1)} tok/s, batch8 ${p.decode.batch8!.tokensPerSec.toFixed(1)} tok/s ` +
        `(${p.batch8OverBatch1.toFixed(2)}x batch 1, the median of ${DECODE_ROUNDS} alternating rounds; target >= 4x)`,
    );
  }
  const f32 = rows.f32 as ReturnType<typeof batchDecode> | undefined;
  const numpy = f32 === undefined ? null : numpyBatch(cfg, f32.decode.batch8!.tokensPerSec);
  const out = { bench: "model-batch", cores: CORES, threads: THREADS, loadBefore, loadAfter: loadAverage(), rows, c, numpy };
  console.log(`load average before ${loadBefore}, after ${out.loadAfter} (${CORES} cores)`);
  mkdirSync(join(import.meta.dir, "results"), { recursive: true });
  writeFileSync(join(import.meta.dir, "results", "model-batch.json"), JSON.stringify(out, null, 2) + "\n");
  process.exit(0);
}

// ---- micro baselines
const naive1 = matmulGflops(matmulRef, 1, 256, 768);
const placed = new Map<Matrix, MatmulKernel>();
const simd: Kernel = (y, x, w, wOff, rows, n, d) => {
  let k = placed.get(w);
  if (k === undefined) placed.set(w, (k = new MatmulKernel([w])));
  k.matmul(y, x, w, wOff, rows, n, d);
};
const tiled1 = matmulGflops(simd, 1, 256, 768);
const tiled64 = matmulGflops(simd, 64, 256, 768);
console.log(
  `plain JS matmul (1x256 by 768x256): ${naive1.toFixed(2)} GFLOP/s; SIMD kernel, one thread: rows=1 ${tiled1.toFixed(2)} (${(tiled1 / naive1).toFixed(2)}x), rows=64 ${tiled64.toFixed(2)} GFLOP/s (${(tiled64 / naive1).toFixed(2)}x)`,
);

const ts: ModelConfig = TS_SHAPE;

const dir = mkdtempSync(join(tmpdir(), "tl-bench-model-"));
const results: Record<string, unknown> = { bench: "model", cores: CORES, threads: THREADS, loadBefore: loadAverage() };
try {
  const path = join(dir, "stories15M.bin");
  writeLlama2cCheckpoint(path, ts, syntheticWeights(ts, 15, { sharedClassifier: true }), true);
  const loaded = loadLlama2cCheckpoint(path);
  const cfg = { ...loaded.cfg, name: ts.name };
  const models = new Map<DType, Transformer>();
  for (const dt of DTYPES) {
    const m = new Transformer(cfg, castWeights(cfg, loaded.weights, dt), { threads: THREADS });
    await m.ready();
    models.set(dt, m);
  }

  // ---- batch-1 decode against run.c, each dtype
  const refs = buildReferences(dir, runcBuilds(CORES));
  const steps = ts.maxSeqLen;
  const { c, ours, ratios } = batch1Rounds(refs, path, models, steps);
  const decode: Record<string, unknown> = {};
  for (const [dt, o] of ours) {
    const bytes = weightBytesPerToken(cfg, castWeights(cfg, loaded.weights, dt));
    const vs = ratios.get(dt)!;
    const vsF32Tokens = dt === "f32" ? steps : prefixAgreement(o.tokens, ours.get("f32")!.tokens);
    const cAgree = refs.length > 0 ? prefixAgreement(o.tokens, c[refs[0]!.name]!.tokens) : null;
    decode[dt] = {
      tokensPerSec: o.tokensPerSec,
      weightGBps: (bytes * o.tokensPerSec) / 1e9,
      weightMB: bytes / 1e6,
      vsC: Object.fromEntries(Object.entries(vs).map(([k, v]) => [k, median(v)])),
      vsCRounds: vs,
      leadingTokensAgreeWithF32: vsF32Tokens,
      leadingTokensAgreeWithC: cAgree,
      tokens: o.tokens,
    };
    console.log(
      `decode batch 1, ${dt}, ${THREADS} threads: ${o.tokensPerSec.toFixed(1)} tok/s, ${((bytes * o.tokensPerSec) / 1e9).toFixed(2)} GB/s of ${(bytes / 1e6).toFixed(1)} MB weights; ` +
        Object.entries(vs)
          .map(([k, v]) => `${median(v).toFixed(2)}x ${k} (${Math.min(...v).toFixed(2)}-${Math.max(...v).toFixed(2)})`)
          .join(", ") +
        ` (medians of ${C_ROUNDS} alternating rounds); first ${vsF32Tokens} greedy tokens agree with f32` +
        (cAgree === null ? "" : `, ${cAgree} with C`),
    );
  }
  for (const [name, r] of Object.entries(c)) console.log(`C ${name}: ${r.tokensPerSec.toFixed(1)} tok/s`);
  results.cReference = Object.fromEntries(refs.map((r) => [r.name, { command: r.command, env: r.env, tokensPerSec: c[r.name]!.tokensPerSec }]));
  results.decodeBatch1 = decode;

  // ---- phases: prefill 512 (a 512-context copy of the shape), batch-8 decode, per dtype
  const long = { ...cfg, maxSeqLen: 512 };
  const phases: Record<string, unknown> = {};
  for (const dt of DTYPES) {
    const m = new Transformer(long, castWeights(long, loaded.weights, dt), { threads: THREADS });
    await m.ready();
    let p: ReturnType<typeof benchPhases>;
    if (dt === "f32") ({ ours: p, c: results.cBatch } = f32BatchVsC(dir, path, (each) => benchPhases(m, 512, each)));
    else p = benchPhases(m, 512);
    m.close();
    const b8 = p.batch8OverBatch1;
    phases[dt] = p;
    console.log(
      `${dt}: prefill 512: ${p.prefill.tokensPerSec.toFixed(0)} tok/s, ${p.prefill.gflops.toFixed(2)} GFLOP/s; ` +
        `decode batch1 ${p.decode.batch1!.tokensPerSec.toFixed(1)} tok/s, batch8 ${p.decode.batch8!.tokensPerSec.toFixed(1)} tok/s (${b8.toFixed(2)}x batch 1, the median of ${DECODE_ROUNDS} alternating rounds; target >= 4x)`,
    );
  }
  results.phases = phases;
  results.numpyBatch = numpyBatch(cfg, (phases.f32 as { decode: Record<string, Phase> }).decode.batch8!.tokensPerSec);
  const np = numpyMatmuls(cfg, 512, false)?.gflops ?? null;
  const ourPrefill = (phases.f32 as { prefill: Phase }).prefill.gflops;
  // The matmuls alone, the shapes numpy runs: the whole forward also counts attention and the rest.
  const ourMatmuls = oursPrefillMatmulGflops(cfg, castWeights(cfg, loaded.weights, "f32"), 512);
  results.numpy =
    np === null
      ? null
      : { prefillGflops: np, oursF32PrefillMatmulGflops: ourMatmuls, matmulRatio: ourMatmuls / np, oursF32PrefillGflops: ourPrefill, ratio: ourPrefill / np };
  console.log(
    np === null
      ? "numpy: does not import, prefill comparison skipped"
      : `prefill 512, GFLOP/s: numpy's matmuls ${np.toFixed(2)}; ours f32, the same matmuls alone ${ourMatmuls.toFixed(2)}: ${(ourMatmuls / np).toFixed(3)}x (target >= 0.25x); ` +
          `the whole prefill forward (attention and the rest included) ${ourPrefill.toFixed(2)}: ${(ourPrefill / np).toFixed(3)}x`,
  );

  // ---- greedy agreement of packed dtypes with f32 on the test prompts (64 steps)
  const prompts = [[1], [1, 400, 3000, 12], [1, 31999, 7, 7, 7, 2048]];
  const agreement: Record<string, unknown[]> = {};
  const f32m = models.get("f32")!;
  const refRuns = prompts.map((p) => runOurs(f32m, 64, p, true));
  for (const dt of DTYPES.filter((d) => d !== "f32")) {
    agreement[dt] = prompts.map((p, i) => {
      const r = runOurs(models.get(dt)!, 64, p, true);
      const k = prefixAgreement(r.tokens, refRuns[i]!.tokens);
      const at = Math.min(k, 63);
      let maxDiff = 0;
      for (let j = 0; j < r.logits[at]!.length; j++) maxDiff = Math.max(maxDiff, Math.abs(r.logits[at]![j]! - refRuns[i]!.logits[at]![j]!));
      return { prompt: p, leadingTokensAgree: k, maxLogitDiffAtStep: at, maxLogitDiff: maxDiff };
    });
    console.log(
      `${dt} vs f32 greedy (64 steps): ` +
        (agreement[dt] as { leadingTokensAgree: number; maxLogitDiff: number; maxLogitDiffAtStep: number }[])
          .map((a) => `${a.leadingTokensAgree}/64 agree (max |logit diff| ${a.maxLogitDiff.toExponential(2)} at step ${a.maxLogitDiffAtStep})`)
          .join("; "),
    );
  }
  results.greedyVsF32 = agreement;

  // ---- the engine loop around the same f32 model, and the event loop's delay. The models above
  // close first: their idle helper threads must not share the two cores with the engine's.
  for (const m of models.values()) m.close();
  results.engine = await enginePart(dir, long, loaded.weights);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
results.micro = { plainJsMatmulGflops: naive1, simdMatmulGflopsRows1: tiled1, simdMatmulGflopsRows64: tiled64 };
results.loadAfter = loadAverage();
console.log(`load average before ${results.loadBefore}, after ${results.loadAfter} (${CORES} cores)`);
mkdirSync(join(import.meta.dir, "results"), { recursive: true });
writeFileSync(join(import.meta.dir, "results", "model.json"), JSON.stringify(results, null, 2) + "\n");
