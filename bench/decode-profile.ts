// Where a decode step's time goes, on the TinyStories-15M shape, per weight dtype and thread
// count: the whole forward, the time inside the matmul dispatches (kernel plus the helper threads'
// handoff) and the rest of forward (attention, norms, the JS between); each kind of dispatch (q/k/v,
// attention, wo, w1/w3, w2, the classifier) with the chunks the helpers took of it; beside it the
// kernel alone (the same calls in the same order on one thread, nothing between them) and the bare
// handoff of a split dispatch that does almost nothing. Ratios: 2 threads over 1 (the step and
// each kind of dispatch), and the kernel alone over the matmuls inside the model (what handoff and
// cache misses cost); then the rest by phase (Transformer.profile over more steps: attention,
// norms, RoPE, the K/V store...). Then, at BATCH > 1, the ceilings this machine puts on that batch
// (see ceilings: the kernel's rate with its weights in cache and from memory, the memory's stream
// rate), against batch 1 measured in the same run. Env: DTYPES, THREADS, BATCH.
import { mkdirSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { type DType, type ModelConfig, Transformer, kvShapeOf } from "../src/model/index.ts";
import { castWeights, syntheticWeights, MATRICES } from "../src/model/compute/weights.ts";
import { J_D, J_FN, J_N, J_R0, J_ROWS, J_W, J_X, J_Y, JOB_INTS } from "../src/model/compute/kernel-exports.ts";
import { J_ATTEND } from "../src/model/compute/kernel-threads.ts";
import { FORWARD_PHASES } from "../src/model/compute/transformer.ts";
import { MatmulKernel } from "../src/model/compute/matmul.ts";
import { castMatrix, dtypeOf, heldBytesOf, type Matrix, matrixBytes, type SimpleMatrix } from "../src/model/compute/packed.ts";
import { loadAverage } from "./stats.ts";
import { TS_SHAPE } from "./ts-shape.ts";

const cfg: ModelConfig = TS_SHAPE;
const DTYPES = (process.env.DTYPES ?? "f32,f16,bf16,q8_0").split(",") as DType[];
const THREADS = (process.env.THREADS ?? `1,${availableParallelism()}`).split(",").map(Number);
const BATCH = Number(process.env.BATCH ?? 1);
const STEPS = 180;

interface Call {
  w: Matrix;
  wOff: number;
  rows: number;
  n: number;
  d: number;
}

/** One kind of dispatch in a step: µs each and chunks the helper threads took of each. */
interface Kind {
  us: number;
  helperChunks: number;
  perStep: number;
}

interface Profile {
  byKind: Record<string, Kind>;
  tokensPerSec: number;
  stepUs: number;
  matmulUs: number;
  restUs: number;
  dispatches: number;
  kernelAloneUs: { layers: number; classifier: number };
  /** µs per step in each phase but the matmuls, from a profiled run after the timed one. */
  restPhasesUs: Record<string, number>;
}

/** Decode at `batch` from a 64-token context, with the kernel's queue and flush timed. */
async function profile(w: ReturnType<typeof castWeights>, threads: number, batch = BATCH): Promise<Profile> {
  const m = new Transformer(cfg, w, { threads });
  await m.ready();
  // The model's own kernel, reached for timing: every matmul goes through queue and flush.
  const mm = (m as unknown as { g: { mm: MatmulKernel } }).g.mm;
  const queue = mm.queue.bind(mm);
  const flush = mm.flush.bind(mm);
  let inside = 0;
  let dispatches = 0;
  let calls: Call[] | null = null;
  mm.queue = (y, x, ww, wOff, rows, n, d) => {
    const t = performance.now();
    queue(y, x, ww, wOff, rows, n, d);
    inside += performance.now() - t;
    calls?.push({ w: ww, wOff, rows, n, d });
  };
  mm.flush = () => {
    const t = performance.now();
    flush();
    inside += performance.now() - t;
    dispatches++;
  };
  const kinds = timeDispatches(mm);
  const pool = m.kvPool(kvShapeOf(cfg, 16), 16 * batch + 1);
  const chunks = Array.from({ length: batch }, () => ({ blockTable: pool.allocate(16)!, startPos: 0, tokens: [1] }));
  const out = new Float32Array(batch * cfg.vocabSize);
  const step = (pos: number): void => {
    for (let s = 0; s < batch; s++) {
      chunks[s]!.startPos = pos;
      chunks[s]!.tokens[0] = (pos * 31 + s) % cfg.vocabSize;
    }
    m.forward(pool, chunks, out);
  };
  for (let p = 0; p < 64; p++) step(p);
  calls = [];
  step(64);
  const recorded = calls;
  calls = null;
  inside = 0;
  dispatches = 0;
  kinds.clear();
  const t0 = performance.now();
  for (let p = 65; p < 65 + STEPS; p++) step(p);
  const total = performance.now() - t0;
  const matmulUs = (inside / STEPS) * 1000;
  const perStep = dispatches / STEPS;
  const byKind: Record<string, Kind> = {};
  for (const [k, v] of kinds) byKind[k] = { us: v.us / v.n, helperChunks: v.helped / v.n, perStep: v.n / STEPS };
  // The same positions again (their K/V are rewritten with the same values): the context stays inside maxSeqLen.
  const restPhasesUs = restPhases(m, step, 65);
  const kernelAloneUs = kernelAlone(mm, recorded, batch);
  m.close();
  return {
    byKind,
    tokensPerSec: ((STEPS * batch) / total) * 1000,
    stepUs: (total / STEPS) * 1000,
    matmulUs,
    restUs: (total / STEPS) * 1000 - matmulUs,
    dispatches: perStep,
    kernelAloneUs,
    restPhasesUs,
  };
}

/**
 * Times every dispatch the kernel makes (matmuls and attention), by kind: the private dispatch
 * step, where the split over the threads happens, wrapped.
 */
function timeDispatches(mm: MatmulKernel): Map<string, { us: number; helped: number; n: number }> {
  const kinds = new Map<string, { us: number; helped: number; n: number }>();
  const inner = mm as unknown as { dispatch(count: number, macs: number, stride: number): void; jobs: Int32Array };
  const dispatch = inner.dispatch.bind(mm);
  inner.dispatch = (count, macs, stride) => {
    const kind = kindOf(inner.jobs, count);
    const helped = mm.splitCalls;
    const t = performance.now();
    dispatch(count, macs, stride);
    const us = (performance.now() - t) * 1000;
    let k = kinds.get(kind);
    if (k === undefined) kinds.set(kind, (k = { us: 0, helped: 0, n: 0 }));
    k.us += us;
    k.helped += mm.splitCalls - helped;
    k.n++;
  };
  return kinds;
}

/** Which of a layer's dispatches (or the classifier) the queued jobs are. */
function kindOf(jobs: Int32Array, count: number): string {
  if (jobs[J_FN] === J_ATTEND) return "attention";
  if (count === 3) return "qkv";
  if (count === 2) return "w1w3";
  if (jobs[J_D] === cfg.vocabSize) return "classifier";
  return jobs[J_N] === cfg.hiddenDim ? "w2" : "wo";
}

/** µs per step of every phase but the matmuls (Transformer.profile), over STEPS / 2 more steps from `from`. */
function restPhases(m: Transformer, step: (pos: number) => void, from: number): Record<string, number> {
  const prof = new Float64Array(FORWARD_PHASES.length);
  m.profile = prof;
  const steps = STEPS / 2;
  for (let p = from; p < from + steps; p++) step(p);
  m.profile = null;
  const r: Record<string, number> = {};
  FORWARD_PHASES.forEach((ph, i) => {
    if (ph !== "matmul" && prof[i]! > 0) r[ph] = (prof[i]! / steps) * 1000;
  });
  return r;
}

/** One step's matmul calls run back to back through the kernel exports, on this thread. */
function kernelAlone(mm: MatmulKernel, calls: Call[], batch: number): { layers: number; classifier: number } {
  const ex = mm.exports!;
  // Room for q8_0's quantized x too (q8_row_bytes: about 8.1 bytes an element, zeros here).
  const x = mm.addressOf(mm.alloc(batch * cfg.hiddenDim * 3));
  const y = mm.addressOf(mm.alloc(batch * cfg.vocabSize));
  const scratch = mm.addressOf(mm.alloc(8 * cfg.hiddenDim + 32));
  // Each call's job record (kernel-exports.ts' J_ slots), written once: the kernels take its address.
  const jobs = mm.allocInts(calls.length * JOB_INTS);
  calls.forEach((c, i) => {
    const b = i * JOB_INTS;
    jobs[b + J_Y] = y;
    jobs[b + J_X] = x;
    jobs[b + J_W] = mm.offsetOf(c.w);
    jobs[b + J_ROWS] = c.rows;
    jobs[b + J_N] = c.n;
    jobs[b + J_D] = c.d;
    jobs[b + J_R0] = c.wOff / c.n;
  });
  const jobAt = new Map(calls.map((c, i) => [c, mm.addressOf(jobs) + i * JOB_INTS * 4]));
  const time = (cs: Call[]): number => {
    const run = (): void => {
      for (const c of cs) {
        const r0 = c.wOff / c.n;
        const fn = `matmul_${dtypeOf(c.w as SimpleMatrix)}` as const;
        ex[fn](jobAt.get(c)!, r0, r0 + c.d, scratch);
      }
    };
    for (let i = 0; i < 10; i++) run();
    const reps = 50;
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) run();
    return ((performance.now() - t0) / reps) * 1000;
  };
  return {
    layers: time(calls.filter((c) => c.d !== cfg.vocabSize)),
    classifier: time(calls.filter((c) => c.d === cfg.vocabSize)),
  };
}

/** µs of a dispatch of 64K multiply-adds (16 x 4096 f32), split over 2 threads and on 1. */
async function handoff(): Promise<{ twoThreadsUs: number; oneThreadUs: number }> {
  const w = new Float32Array(16 * 4096).fill(0.5);
  const two = new MatmulKernel([{ matrix: w, cols: 16 }], { threads: 2 });
  const one = new MatmulKernel([{ matrix: w, cols: 16 }]);
  await two.ready();
  const best = (k: MatmulKernel): number => {
    const x = k.alloc(16);
    const y = k.alloc(4096);
    let b = Number.POSITIVE_INFINITY;
    for (let round = 0; round < 5; round++) {
      const t0 = performance.now();
      for (let i = 0; i < 10000; i++) k.matmul(y, x, w, 0, 1, 16, 4096);
      b = Math.min(b, (performance.now() - t0) / 10);
    }
    return b;
  };
  const r = { twoThreadsUs: best(two), oneThreadUs: best(one) };
  two.close();
  return r;
}

/**
 * The best ms per call of each of `runs` over 12 rounds of at least 50 ms, taken in turn: on a
 * shared machine, a quiet moment then serves every one of them.
 */
function bestMs(runs: (() => void)[]): number[] {
  for (const run of runs) for (let i = 0; i < 3; i++) run();
  const best = runs.map(() => Number.POSITIVE_INFINITY);
  for (let round = 0; round < 12; round++) {
    runs.forEach((run, i) => {
      let reps = 0;
      const t0 = performance.now();
      let t = t0;
      for (; t - t0 < 50; t = performance.now()) {
        run();
        reps++;
      }
      best[i] = Math.min(best[i]!, (t - t0) / reps);
    });
  }
  return best;
}

/** A d x n matrix of dtype dt placed in a kernel of its own (threads as given). */
function placedMatrix(dt: DType, n: number, d: number, threads = 1): { k: MatmulKernel; v: Matrix } {
  const src = new Float32Array(n * d).map((_, i) => Math.sin(i * 0.37) * 0.1);
  const k = new MatmulKernel([{ matrix: dt === "f32" ? src : castMatrix(src, dt, n), cols: n }], { threads });
  return { k, v: k.views[0]! };
}

/** The dtype's kernel on this thread alone, `rows` token rows against a d x n matrix: one call, its multiply-adds. */
function tileCall(dt: DType, rows: number, n: number, d: number): { run: () => void; macs: number; close: () => void } {
  const { k, v } = placedMatrix(dt, n, d);
  const ex = k.exports!;
  const xf = k.alloc(rows * n);
  for (let i = 0; i < xf.length; i++) xf[i] = Math.cos(i * 0.11);
  let x = k.addressOf(xf);
  if (dt === "q8_0") {
    const q = k.addressOf(k.allocBytes(rows * ex.q8_row_bytes(n))!);
    ex.quantize_q8_x(q, x, rows, n);
    x = q;
  }
  const y = k.addressOf(k.alloc(rows * d));
  const scratch = k.addressOf(k.alloc(8 * n + 32));
  const fn = ex[`matmul_${dt}`];
  // The call's job record (kernel-exports.ts' J_ slots; fn and r0 stay 0): the kernel takes its address.
  const job = k.allocInts(JOB_INTS);
  job[J_Y] = y;
  job[J_X] = x;
  job[J_W] = k.offsetOf(v);
  job[J_ROWS] = rows;
  job[J_N] = n;
  job[J_D] = d;
  const at = k.addressOf(job);
  return { run: () => fn(at, 0, d, scratch), macs: rows * n * d, close: () => k.close() };
}

/**
 * GB/s of f32 weights one token row streams through the classifier's shape on `threads` threads:
 * the memory's rate (one row's f32 kernel does a quarter of a multiply-add per byte, far below
 * its compute; a packed dtype's single row is bound by its widening instead, so is no measure).
 */
async function streamGBs(threads: number): Promise<number> {
  const n = cfg.dim;
  const d = cfg.vocabSize;
  const { k, v } = placedMatrix("f32", n, d, threads);
  await k.ready();
  const x = k.alloc(n).fill(0.5);
  const y = k.alloc(d);
  const [ms] = bestMs([() => k.matmul(y, x, v, 0, 1, n, d)]);
  k.close();
  return (4 * n * d) / ms! / 1e6;
}

/** ceilings' figures (GMAC/s, GB/s, tok/s, and each tok/s over batch 1's). */
interface Ceilings {
  macsPerToken: number;
  weightBytes: number;
  tileInCacheGmacs: number;
  tileFromMemoryGmacs: number;
  serialModelFromMemoryGmacs: number;
  streamOneThreadGBs: number;
  streamGBs: number;
  batch1TokS: number;
  measuredTokS: number;
  computeCeilingTokS: number;
  serialCeilingTokS: number;
  serialPlusRestTokS: number;
  measuredOverBatch1: number;
  computeCeilingOverBatch1: number;
  serialCeilingOverBatch1: number;
  serialPlusRestOverBatch1: number;
}

/**
 * What this machine allows BATCH rows of decode, per dtype, from rates measured here. Each token
 * costs its multiply-adds (every matrix but the embedding once, attention over the context), and
 * each step reads every weight once. Bounds, from loosest:
 *  - compute: the threads at the kernel's rate on one thread with the weights in cache (a matrix
 *    that fits L2), nothing else running;
 *  - serial: that compute plus the step's weight bytes at the memory's stream rate (streamGBs),
 *    one after the other. WebAssembly has no prefetch, and the hardware's does not keep up: a
 *    batch's tile reads a strip from memory in its first pass and from L1 in the others, leaving
 *    the memory idle meanwhile, so compute and memory add up. The model is checked on one thread: it
 *    predicts the kernel's rate on the classifier (from memory) from the in-cache rate and the
 *    one-thread stream rate, beside the measured one;
 *  - serial plus the measured rest of the step (attention, norms, RoPE, K/V, SwiGLU, the JS).
 * Each as tok/s and as a multiple of batch 1's tok/s measured in this run.
 */
function ceilings(
  dt: DType,
  w: ReturnType<typeof castWeights>,
  threads: number,
  stream: { one: number; all: number },
  atBatch: Profile,
  batch1: Profile,
): Ceilings {
  const n = cfg.dim;
  let weightMacs = 0;
  let weightBytes = 0;
  for (const k of MATRICES) {
    if (k === "tokenEmbedding") continue;
    weightMacs += w[k].length;
    weightBytes += heldBytesOf(w[k]);
  }
  // The timed steps run positions 65 .. 64 + STEPS: each attends to pos + 1 positions.
  const ctx = 65 + (STEPS - 1) / 2 + 1;
  const macsPerToken = weightMacs + 2 * cfg.nLayers * cfg.nHeads * (cfg.dim / cfg.nHeads) * ctx;
  // A 768-row matrix fits L2 (0.9 MB in f32; 1536 rows missed into L3 once the classifier had run
  // between), the classifier's no cache.
  const calls = [tileCall(dt, BATCH, n, 768), tileCall(dt, BATCH, n, cfg.vocabSize)];
  const [inCache, fromMemory] = bestMs(calls.map((c) => c.run)).map((ms, i) => calls[i]!.macs / ms / 1e6) as [number, number];
  for (const c of calls) c.close();
  const stream1 = stream.one;
  const streamT = stream.all;
  const bytesPerMac = matrixBytes(dt, 1024) / 1024 / BATCH;
  const serialModel = 1 / (1 / inCache + bytesPerMac / stream1);
  const computeS = (BATCH * macsPerToken) / (threads * inCache * 1e9);
  const memoryS = weightBytes / (streamT * 1e9);
  const restS = atBatch.restUs / 1e6;
  const tokS = (sec: number): number => BATCH / sec;
  const b1 = batch1.tokensPerSec;
  return {
    macsPerToken,
    weightBytes,
    tileInCacheGmacs: inCache,
    tileFromMemoryGmacs: fromMemory,
    serialModelFromMemoryGmacs: serialModel,
    streamOneThreadGBs: stream1,
    streamGBs: streamT,
    batch1TokS: b1,
    measuredTokS: atBatch.tokensPerSec,
    computeCeilingTokS: tokS(computeS),
    serialCeilingTokS: tokS(computeS + memoryS),
    serialPlusRestTokS: tokS(computeS + memoryS + restS),
    measuredOverBatch1: atBatch.tokensPerSec / b1,
    computeCeilingOverBatch1: tokS(computeS) / b1,
    serialCeilingOverBatch1: tokS(computeS + memoryS) / b1,
    serialPlusRestOverBatch1: tokS(computeS + memoryS + restS) / b1,
  };
}

const results: Record<string, unknown> = { bench: "decode-profile", batch: BATCH, loadBefore: loadAverage() };
const base = syntheticWeights(cfg, 15, { sharedClassifier: true });
const byDtype: Record<string, Record<string, Profile>> = {};
const ceilingsByDtype: Record<string, Ceilings> = {};
let stream: { one: number; all: number } | undefined;
for (const dt of DTYPES) {
  const w = castWeights(cfg, base, dt);
  byDtype[dt] = {};
  for (const threads of THREADS) {
    const p = await profile(w, threads);
    byDtype[dt]![`threads${threads}`] = p;
    const alone = p.kernelAloneUs.layers + p.kernelAloneUs.classifier;
    console.log(
      `${dt}, ${threads} threads, batch ${BATCH}: ${p.tokensPerSec.toFixed(1)} tok/s; a step ${p.stepUs.toFixed(0)} us = ` +
        `matmuls ${p.matmulUs.toFixed(0)} us in ${p.dispatches} dispatches + the rest ${p.restUs.toFixed(0)} us; ` +
        `kernel alone on one thread ${alone.toFixed(0)} us (layers ${p.kernelAloneUs.layers.toFixed(0)}, classifier ${p.kernelAloneUs.classifier.toFixed(0)}): ` +
        `${(alone / p.matmulUs).toFixed(2)}x the matmuls in the model; per dispatch: ` +
        Object.entries(p.byKind)
          .map(([k, v]) => `${k} ${v.us.toFixed(1)} us` + (threads > 1 ? ` (helpers ${v.helperChunks.toFixed(1)} chunks)` : ""))
          .join(", ") +
        "; the rest by phase (us): " +
        Object.entries(p.restPhasesUs)
          .map(([ph, us]) => `${ph} ${us.toFixed(0)}`)
          .join(", "),
    );
  }
  if (BATCH > 1) {
    const threads = THREADS[THREADS.length - 1]!;
    stream ??= { one: await streamGBs(1), all: await streamGBs(threads) };
    const c = ceilings(dt, w, threads, stream, byDtype[dt]![`threads${threads}`]!, await profile(w, threads, 1));
    ceilingsByDtype[dt] = c;
    console.log(
      `${dt} ceilings at batch ${BATCH}, ${threads} threads: ${(c.macsPerToken / 1e6).toFixed(2)}M multiply-adds a token, ${(c.weightBytes / 1e6).toFixed(1)} MB of weights a step; ` +
        `kernel on one thread ${c.tileInCacheGmacs.toFixed(1)} GMAC/s in cache, ${c.tileFromMemoryGmacs.toFixed(1)} from memory (compute then memory in series predicts ${c.serialModelFromMemoryGmacs.toFixed(1)}); ` +
        `the memory streams ${c.streamOneThreadGBs.toFixed(1)} GB/s to one thread, ${c.streamGBs.toFixed(1)} to ${threads}; ` +
        `tok/s: batch 1 ${c.batch1TokS.toFixed(0)}, batch ${BATCH} ${c.measuredTokS.toFixed(0)} (${c.measuredOverBatch1.toFixed(2)}x); ` +
        `ceilings: compute ${c.computeCeilingTokS.toFixed(0)} (${c.computeCeilingOverBatch1.toFixed(2)}x), compute + memory ${c.serialCeilingTokS.toFixed(0)} (${c.serialCeilingOverBatch1.toFixed(2)}x), ` +
        `+ the measured rest ${c.serialPlusRestTokS.toFixed(0)} (${c.serialPlusRestOverBatch1.toFixed(2)}x)`,
    );
  }
  const [a, b] = THREADS.map((t) => byDtype[dt]![`threads${t}`]!);
  if (a !== undefined && b !== undefined) {
    const kinds = Object.keys(a.byKind).map((k) => `${k} ${(a.byKind[k]!.us / (b.byKind[k]?.us ?? Number.NaN)).toFixed(2)}x`);
    console.log(`${dt}: ${THREADS[1]} threads over ${THREADS[0]}: ${(b.tokensPerSec / a.tokensPerSec).toFixed(2)}x; per dispatch ${kinds.join(", ")}`);
  }
}
results.decode = byDtype;
if (BATCH > 1) results.ceilings = ceilingsByDtype;
const h = await handoff();
results.handoff = h;
console.log(
  `a split dispatch of 64K multiply-adds: 2 threads ${h.twoThreadsUs.toFixed(2)} us, 1 thread ${h.oneThreadUs.toFixed(2)} us (${(h.oneThreadUs / h.twoThreadsUs).toFixed(2)}x)`,
);
results.loadAfter = loadAverage();
console.log(`load average before ${results.loadBefore}, after ${results.loadAfter} (${availableParallelism()} cores)`);
mkdirSync(join(import.meta.dir, "results"), { recursive: true });
writeFileSync(join(import.meta.dir, "results", "decode-profile.json"), `${JSON.stringify(results, null, 2)}\n`);
