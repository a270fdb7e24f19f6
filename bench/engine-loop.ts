// The engine loop of bench/model.ts: Engine.step around one f32 model against the transformer
// alone, and the event loop's delay while the engine prefills 512 tokens and decodes at batch 32,
// with the model on the event loop's thread and then on a model thread of its own (ModelWorker,
// loading the same weights from a file, as engines run it).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { Engine, type ModelPort, transformerPort, WorkerPort } from "../src/engine/index.ts";
import { blockPayloadBytes } from "../src/codec/index.ts";
import { type KvSlab, type ModelConfig, ModelWorker, Transformer, kvShapeOf } from "../src/model/index.ts";
import type { ModelThreadCounters } from "../src/model/thread/model-worker.ts";
import { type Weights, syntheticWeights } from "../src/model/compute/weights.ts";
import { writeLlama2cCheckpoint } from "../src/model/load/llama2c.ts";
import { KvPool } from "../src/pool/index.ts";
import { loadAverage, median } from "./stats.ts";
import { TS_SHAPE } from "./ts-shape.ts";

const BLOCK = 16;
const THREADS = Number(process.env.BENCH_THREADS ?? availableParallelism());
/** BENCH_QUICK=1: batch-1 decode tok/s only (no delay probes), for A/B pairs. */
const QUICK = process.env.BENCH_QUICK === "1";
/** Rounds of (transformer alone, each engine loop) decoding DECODE_STEPS (BENCH_STEPS) tokens each. */
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 15);
/**
 * Rounds run first and not counted (BENCH_WARMUP): code run once a token (the engine's, the
 * model thread's) keeps being recompiled at higher tiers for thousands of tokens, on JIT threads
 * that take the cores from the kernel threads, so early rounds measure the compiler.
 */
const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
const DECODE_STEPS = Number(process.env.BENCH_STEPS ?? 256);
/** BENCH_DEPTH: the engine's pipelineDepth over the model thread (default the engine's own). */
const DEPTH = process.env.BENCH_DEPTH === undefined ? undefined : Number(process.env.BENCH_DEPTH);

interface LoopResult {
  decodeTokensPerSec: number;
  /** A model thread's: the share of the decode's wall time it spent in forwards (the rest it spent waking the engine or waiting for a step: perToken). */
  modelBusyShare: number | null;
  /** A model thread's: where the engine's share of a decode went, per decoded token. */
  perToken: PerToken | null;
  loopDelayP99Ms: number;
  loopDelayMaxMs: number;
}

/** Per decoded token, over a decode over a model thread. */
interface PerToken {
  /** Times the engine's thread woke to settle forwards (pipelined, it may settle two at once). */
  engineWakes: number;
  /** Microseconds of CPU the engine's (main) thread used, from /proc (null where there is none). */
  engineCpuUs: number | null;
  /** Times the model thread found no forward posted and waited on the engine. */
  modelIdleWaits: number;
  /** Microseconds the model thread spent waking the engine (mostly the engine's own work, run on its core: see STAT_NOTIFY_MS). */
  modelNotifyUs: number;
}

/** CPU microseconds the main thread (on Linux, the task whose id is the process's) has run, or null. */
function mainThreadCpuUs(): number | null {
  try {
    return Number(readFileSync(`/proc/self/task/${process.pid}/schedstat`, "utf8").split(" ")[0]) / 1000;
  } catch {
    return null;
  }
}

function perToken(a: ModelThreadCounters, b: ModelThreadCounters, cpuA: number | null, cpuB: number | null, tokens: number): PerToken {
  return {
    engineWakes: (b.wakes - a.wakes) / tokens,
    engineCpuUs: cpuA === null || cpuB === null ? null : (cpuB - cpuA) / tokens,
    modelIdleWaits: (b.idleWaits - a.idleWaits) / tokens,
    modelNotifyUs: ((b.notifyMs - a.notifyMs) * 1000) / tokens,
  };
}

/**
 * Decode tok/s of `batch` greedy requests through Engine.step, and (with `probeDelay`) the event
 * loop's delay while they run. The probe is a 1 ms timer: on 2 cores its wake-ups take a core
 * from the kernel threads a thousand times a second, so tok/s is measured without it.
 */
export async function engineLoop(
  model: ModelPort,
  cfg: ModelConfig,
  prompt: number[],
  maxTokens: number,
  batch: number,
  kvSlab?: (bytes: number) => Promise<KvSlab[] | null>,
  probeDelay = true,
): Promise<LoopResult> {
  const blocks = batch * Math.ceil((prompt.length + maxTokens + 1) / BLOCK) + 4;
  const shape = kvShapeOf(cfg, BLOCK);
  // As engines make it (kvPoolFor): in the model kernels' memory, where attention reads it in place.
  const room = (await kvSlab?.(blocks * blockPayloadBytes(shape))) ?? null;
  const pool = new KvPool(shape, blocks, room === null ? { shared: model instanceof WorkerPort } : { segments: room });
  const engine = new Engine({ model, pool, maxModelLen: cfg.maxSeqLen, maxBatchTokens: 512, maxRunning: batch, pipelineDepth: DEPTH });
  const probe = probeDelay ? delayProbe() : null;
  let first = 0;
  let decoded = 0;
  const counters = () => (model instanceof WorkerPort ? model.worker.counters : null);
  let atFirst = counters();
  let cpuFirst: number | null = null;
  await Promise.all(
    Array.from({ length: batch }, (_, s) =>
      engine
        .submit({
          requestId: `r${s}`,
          promptTokens: prompt.map((t) => (t + s) % cfg.vocabSize),
          sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens, stopTokenIds: [] },
          onToken: () => {
            if (first === 0) {
              first = performance.now();
              atFirst = counters();
              cpuFirst = mainThreadCpuUs();
            } else decoded++;
          },
        })
        .then((f) => {
          if (f.reason === "error") throw new Error(`engine request failed: ${f.error}`);
        }),
    ),
  );
  const end = performance.now();
  const cpuEnd = mainThreadCpuUs();
  const atEnd = counters();
  const modelBusyShare = atEnd && atFirst ? (atEnd.busyMs - atFirst.busyMs) / (end - first) : null;
  const per = atEnd && atFirst ? perToken(atFirst, atEnd, cpuFirst, cpuEnd, decoded) : null;
  const delay = probe?.stop() ?? { p99: 0, max: 0 };
  return {
    decodeTokensPerSec: (decoded / (end - first)) * 1000,
    modelBusyShare,
    perToken: per,
    loopDelayP99Ms: delay.p99,
    loopDelayMaxMs: delay.max,
  };
}

/** The event loop's delay: how late a 1 ms timer fires, every time it fires until stop (p99 and max, ms). */
function delayProbe(): { stop: () => { p99: number; max: number } } {
  const lags: number[] = [];
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    lags.push(Math.max(0, now - last - 1));
    last = now;
  }, 1);
  return {
    stop: () => {
      clearInterval(timer);
      lags.push(performance.now() - last);
      lags.sort((a, b) => a - b);
      return { p99: lags[Math.min(lags.length - 1, Math.floor(lags.length * 0.99))]!, max: lags[lags.length - 1]! };
    },
  };
}

type Round = { alone: number; engine: Record<string, number>; modelThreadBusy: number; perToken: PerToken | null };

/** WARMUP rounds not counted, then ROUNDS rounds of each runner's engine loop between two runs of the transformer alone. */
async function engineRounds(
  local: Transformer,
  long: ModelConfig,
  runners: Record<string, ModelPort>,
  slabs: Record<string, (bytes: number) => Promise<KvSlab[] | null>>,
): Promise<Round[]> {
  // The transformer alone runs before and after the engine loops of a round (its figure is the
  // mean of the two), so a change in the machine's load within a round favours no side of its ratios.
  const round = async (): Promise<Round> => {
    const engine: Record<string, number> = {};
    let modelThreadBusy = 0;
    let per: PerToken | null = null;
    const before = aloneDecode(local, DECODE_STEPS);
    for (const where of Object.keys(runners)) {
      const res = await engineLoop(runners[where]!, long, [1], DECODE_STEPS, 1, slabs[where], false);
      engine[where] = res.decodeTokensPerSec;
      modelThreadBusy = res.modelBusyShare ?? modelThreadBusy;
      per = res.perToken ?? per;
    }
    const alone = (before + aloneDecode(local, DECODE_STEPS)) / 2;
    return { alone, engine, modelThreadBusy, perToken: per };
  };
  for (let r = 0; r < WARMUP; r++) await round();
  const rounds: Round[] = [];
  for (let r = 0; r < ROUNDS; r++) rounds.push(await round());
  return rounds;
}

/** One runner's ratio over its rounds, and (unless QUICK) the event loop's delay during a 512-token prefill and a batch-32 decode. */
async function runnerReport(
  where: string,
  runner: ModelPort,
  long: ModelConfig,
  rounds: Round[],
  aloneTps: number,
  slab: ((bytes: number) => Promise<KvSlab[] | null>) | undefined,
): Promise<Record<string, unknown>> {
  const ratios = rounds.map((r) => r.engine[where]! / r.alone);
  const ratio = median(ratios);
  const tps = median(rounds.map((r) => r.engine[where]!));
  const head =
    `engine loop, model on the ${where} thread: decode ${tps.toFixed(1)} tok/s vs transformer alone ${aloneTps.toFixed(1)}: ` +
    `${ratio.toFixed(2)}x (median of ${ROUNDS} rounds, ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}; target >= 0.9x)`;
  if (QUICK) {
    console.log(head);
    return { decodeTokensPerSec: tps, ratio, ratios };
  }
  const prompt = Array.from({ length: 511 }, (_, i) => (i * 13 + 1) % long.vocabSize);
  const prefill = await engineLoop(runner, long, prompt, 1, 1, slab);
  const decode32 = await engineLoop(runner, long, [1, 2, 3, 4], 48, 32, slab);
  console.log(
    `${head}; event loop delay p99: 512-token prefill ${prefill.loopDelayP99Ms.toFixed(1)} ms, batch-32 decode ${decode32.loopDelayP99Ms.toFixed(1)} ms (target <= 10 ms); ` +
      `batch-32 decode ${decode32.decodeTokensPerSec.toFixed(0)} tok/s`,
  );
  return {
    decodeTokensPerSec: tps,
    ratio,
    ratios,
    loopDelayP99Ms: { prefill512: prefill.loopDelayP99Ms, decodeBatch32: decode32.loopDelayP99Ms },
    loopDelayMaxMs: { prefill512: prefill.loopDelayMaxMs, decodeBatch32: decode32.loopDelayMaxMs },
    decodeBatch32TokensPerSec: decode32.decodeTokensPerSec,
  };
}

/**
 * The engine part of bench/model.ts. The baseline is the transformer's own batch-1 greedy tok/s
 * (aloneDecode), measured in rounds with each engine loop's, so a change in the machine's load
 * moves both sides of a ratio: each round's ratio is engine / alone of that round, and the median
 * round is reported.
 */
export async function enginePart(dir: string, long: ModelConfig, weights: Weights): Promise<Record<string, unknown>> {
  const path = join(dir, "stories15M-512.bin");
  writeLlama2cCheckpoint(path, long, weights, true);
  // The loader wants a llama2.c model's tokenizer file; the engine here is fed token ids.
  const tokenizerPath = join(dir, "tokenizer.bin");
  writeFileSync(tokenizerPath, "");
  const local = new Transformer(long, weights, { threads: THREADS });
  await local.ready();
  const worker = await ModelWorker.start({ modelPath: path, tokenizerPath, threads: THREADS, dtype: "f32" });
  const runners: Record<string, ModelPort> = { main: transformerPort(local), worker: new WorkerPort(worker) };
  const slabs: Record<string, (bytes: number) => Promise<KvSlab[] | null>> = {
    main: async (bytes) => local.kvSlab(bytes),
    worker: (bytes) => worker.kvSlab(bytes),
  };
  aloneDecode(local, 16);
  for (const where of Object.keys(runners)) await engineLoop(runners[where]!, long, [1], 16, 1, slabs[where], false);
  const rounds = await engineRounds(local, long, runners, slabs);
  const busyShare = median(rounds.map((r) => r.modelThreadBusy));
  const perTokenMedian = medianPerToken(rounds.map((r) => r.perToken).filter((p) => p !== null));
  console.log(
    `model thread busy ${(busyShare * 100).toFixed(1)}% of the worker engine's batch-1 decode (median of ${ROUNDS} rounds after ${WARMUP} not counted; the rest it woke the engine or waited for a step); ` +
      `per token: ${perTokenMedian.engineWakes.toFixed(2)} engine wakes, engine thread CPU ${perTokenMedian.engineCpuUs?.toFixed(0) ?? "?"} us, ` +
      `model thread ${perTokenMedian.modelNotifyUs.toFixed(0)} us waking the engine, ${perTokenMedian.modelIdleWaits.toFixed(3)} waits for a step`,
  );
  const aloneTps = median(rounds.map((r) => r.alone));
  const out: Record<string, unknown> = {
    transformerAloneTokensPerSec: aloneTps,
    decodeSteps: DECODE_STEPS,
    warmupRounds: WARMUP,
    modelThreadBusyShare: busyShare,
    modelThreadPerToken: perTokenMedian,
    rounds,
  };
  for (const [where, runner] of Object.entries(runners)) out[where] = await runnerReport(where, runner, long, rounds, aloneTps, slabs[where]);
  worker.close();
  local.close();
  return out;
}

/** Each field's median over the rounds. */
function medianPerToken(ps: PerToken[]): PerToken {
  const cpu = ps.map((p) => p.engineCpuUs).filter((c) => c !== null);
  return {
    engineWakes: median(ps.map((p) => p.engineWakes)),
    engineCpuUs: cpu.length > 0 ? median(cpu) : null,
    modelIdleWaits: median(ps.map((p) => p.modelIdleWaits)),
    modelNotifyUs: median(ps.map((p) => p.modelNotifyUs)),
  };
}

/** The transformer alone, batch-1 greedy from [1]: tok/s over `steps` steps after the first (the prompt's). */
export function aloneDecode(m: Transformer, steps: number): number {
  const cfg = m.cfg;
  const n = Math.ceil((steps + 1) / BLOCK);
  const pool = m.kvPool(kvShapeOf(cfg, BLOCK), n);
  const chunk = { blockTable: pool.allocate(n)!, startPos: 0, tokens: [1] };
  const out = new Float32Array(cfg.vocabSize);
  let start = 0;
  for (let i = 0; i < steps; i++) {
    m.forward(pool, [chunk], out);
    let next = 0;
    for (let j = 1; j < cfg.vocabSize; j++) if (out[j]! > out[next]!) next = j;
    chunk.startPos += chunk.tokens.length;
    chunk.tokens = [next];
    if (i === 0) start = performance.now();
  }
  return ((steps - 1) / (performance.now() - start)) * 1000;
}

// On its own (`npx bun bench/engine-loop.ts`): the engine part alone, on synthetic weights of
// the TinyStories-15M shape (as bench/model.ts makes them), into results/engine-loop.json.
if (import.meta.main) {
  const loadBefore = loadAverage();
  const long: ModelConfig = { ...TS_SHAPE, maxSeqLen: 512 };
  const dir = mkdtempSync(join(tmpdir(), "tl-bench-engine-loop-"));
  try {
    const engine = await enginePart(dir, long, syntheticWeights(long, 15, { sharedClassifier: true }));
    const out = { bench: "engine-loop", cores: availableParallelism(), threads: THREADS, loadBefore, loadAfter: loadAverage(), engine };
    console.log(`load average before ${loadBefore}, after ${out.loadAfter}`);
    mkdirSync(join(import.meta.dir, "results"), { recursive: true });
    writeFileSync(join(import.meta.dir, "results", "engine-loop.json"), JSON.stringify(out, null, 2) + "\n");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
