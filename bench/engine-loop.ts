// The engine loop of bench/model.ts: Engine.step around one f32 model against the transformer
// alone, and the event loop's delay while the engine prefills 512 tokens and decodes at batch 32,
// with the model on the event loop's thread and then on a model thread of its own (ModelWorker,
// loading the same weights from a file, as engines run it).
import { writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { Engine, type ModelRunner } from "../src/engine/index.ts";
import { blockPayloadBytes } from "../src/codec/index.ts";
import { type KvSlab, type ModelConfig, ModelWorker, Transformer, type Weights, kvShapeOf, writeLlama2cCheckpoint } from "../src/model/index.ts";
import { KvPool } from "../src/pool/index.ts";

const BLOCK = 16;
const THREADS = Number(process.env.BENCH_THREADS ?? availableParallelism());

interface LoopResult {
  decodeTokensPerSec: number;
  loopDelayP99Ms: number;
  loopDelayMaxMs: number;
}

/**
 * Decode tok/s of `batch` greedy requests through Engine.step, and (with `probeDelay`) the event
 * loop's delay while they run. The probe is a 1 ms timer: on 2 cores its wake-ups take a core
 * from the kernel threads a thousand times a second, so tok/s is measured without it.
 */
export async function engineLoop(
  model: ModelRunner,
  cfg: ModelConfig,
  prompt: number[],
  maxTokens: number,
  batch: number,
  kvSlab?: (bytes: number) => Promise<KvSlab | null>,
  probeDelay = true,
): Promise<LoopResult> {
  const blocks = batch * Math.ceil((prompt.length + maxTokens + 1) / BLOCK) + 4;
  const shape = kvShapeOf(cfg, BLOCK);
  // As engines make it (kvPoolFor): in the model kernels' memory, where attention reads it in place.
  const room = (await kvSlab?.(blocks * blockPayloadBytes(shape))) ?? null;
  const pool = new KvPool(shape, blocks, room ?? { shared: model instanceof ModelWorker });
  const engine = new Engine({ model, pool, maxModelLen: cfg.maxSeqLen, maxBatchTokens: 512, maxRunning: batch });
  // The event loop's delay: how late a 1 ms timer fires, every time it fires while the engine runs.
  const lags: number[] = [];
  let last = performance.now();
  const timer = probeDelay
    ? setInterval(() => {
        const now = performance.now();
        lags.push(Math.max(0, now - last - 1));
        last = now;
      }, 1)
    : undefined;
  let first = 0;
  let decoded = 0;
  await Promise.all(
    Array.from({ length: batch }, (_, s) =>
      engine
        .submit({
          requestId: `r${s}`,
          promptTokens: prompt.map((t) => (t + s) % cfg.vocabSize),
          sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens, stopTokenIds: [] },
          onToken: () => {
            if (first === 0) first = performance.now();
            else decoded++;
          },
        })
        .then((f) => {
          if (f.reason === "error") throw new Error(`engine request failed: ${f.error}`);
        }),
    ),
  );
  const end = performance.now();
  clearInterval(timer);
  lags.push(performance.now() - last);
  lags.sort((a, b) => a - b);
  const p99 = lags[Math.min(lags.length - 1, Math.floor(lags.length * 0.99))]!;
  return { decodeTokensPerSec: (decoded / (end - first)) * 1000, loopDelayP99Ms: p99, loopDelayMaxMs: lags[lags.length - 1]! };
}

/**
 * The engine part of bench/model.ts: `alone` is the transformer's own batch-1 greedy tok/s (the
 * bench's runOurs), the baseline both engine loops are divided by.
 */
export async function enginePart(dir: string, long: ModelConfig, weights: Weights, alone: (m: Transformer) => number): Promise<Record<string, unknown>> {
  const path = join(dir, "stories15M-512.bin");
  writeLlama2cCheckpoint(path, long, weights, true);
  // The loader wants a llama2.c model's tokenizer file; the engine here is fed token ids.
  const tokenizerPath = join(dir, "tokenizer.bin");
  writeFileSync(tokenizerPath, "");
  const local = new Transformer(long, weights, { threads: THREADS });
  await local.ready();
  const worker = await ModelWorker.start({ modelPath: path, tokenizerPath, threads: THREADS, dtype: "f32" });
  const runners: Record<string, ModelRunner> = { main: { vocabSize: long.vocabSize, forward: (p, b, o) => local.forward(p, b, o) }, worker };
  const slabs: Record<string, (bytes: number) => Promise<KvSlab | null>> = {
    main: async (bytes) => local.kvSlab(bytes),
    worker: (bytes) => worker.kvSlab(bytes),
  };
  const aloneTps = alone(local);
  const prompt = Array.from({ length: 511 }, (_, i) => (i * 13 + 1) % long.vocabSize);
  const out: Record<string, unknown> = { transformerAloneTokensPerSec: aloneTps };
  for (const [where, runner] of Object.entries(runners)) {
    const slab = slabs[where];
    await engineLoop(runner, long, [1], 16, 1, slab, false);
    const [a, b] = [await engineLoop(runner, long, [1], 128, 1, slab, false), await engineLoop(runner, long, [1], 128, 1, slab, false)];
    const eng = a.decodeTokensPerSec > b.decodeTokensPerSec ? a : b;
    const prefill = await engineLoop(runner, long, prompt, 1, 1, slab);
    const decode32 = await engineLoop(runner, long, [1, 2, 3, 4], 48, 32, slab);
    const ratio = eng.decodeTokensPerSec / aloneTps;
    console.log(
      `engine loop, model on the ${where} thread: decode ${eng.decodeTokensPerSec.toFixed(1)} tok/s vs transformer alone ${aloneTps.toFixed(1)}: ${ratio.toFixed(2)}x (target >= 0.9x); ` +
        `event loop delay p99: 512-token prefill ${prefill.loopDelayP99Ms.toFixed(1)} ms, batch-32 decode ${decode32.loopDelayP99Ms.toFixed(1)} ms (target <= 10 ms); ` +
        `batch-32 decode ${decode32.decodeTokensPerSec.toFixed(0)} tok/s`,
    );
    out[where] = {
      decodeTokensPerSec: eng.decodeTokensPerSec,
      ratio,
      loopDelayP99Ms: { prefill512: prefill.loopDelayP99Ms, decodeBatch32: decode32.loopDelayP99Ms },
      loopDelayMaxMs: { prefill512: prefill.loopDelayMaxMs, decodeBatch32: decode32.loopDelayMaxMs },
      decodeBatch32TokensPerSec: decode32.decodeTokensPerSec,
    };
  }
  worker.close();
  local.close();
  return out;
}
