// The model thread's program (a Worker entry: `npm run build` names it beside bin/engine.ts). It
// loads the weights itself, so the engine's thread never holds them, then runs every forward the
// engine hands it over shared memory (model-worker-protocol.ts states the handshake).
import { KvPool } from "../pool/index.ts";
import { holdWeights } from "./held-weights.ts";
import { LogitsRows } from "./logits-rows.ts";
import { readModelFilesFor } from "./load-model.ts";
import {
  CTRL_INTS,
  DONE,
  FAILED,
  type FromModelThread,
  GEN,
  IDLE,
  logitsViews,
  type ReadPlan,
  newReadPlan,
  readPlan,
  sampleRows,
  SLOTS,
  slotOf,
  STAT_BUSY_MS,
  STAT_IDLE_MS,
  STAT_IDLE_WAITS,
  STAT_NOTIFIES,
  STAT_NOTIFY_MS,
  statsCells,
  type ToModelThread,
  VER,
  WAKE,
  writeError,
} from "./model-worker-protocol.ts";
import { Transformer } from "./transformer.ts";
import { weightsBytes } from "./weights.ts";

declare const self: { onmessage: ((e: MessageEvent<ToModelThread>) => void) | null; postMessage(m: FromModelThread): void };

let model: Transformer | null = null;
let ctrl: Int32Array = new Int32Array(CTRL_INTS);
let pool: KvPool | null = null;
const plans: Int32Array[] = Array.from({ length: SLOTS }, () => new Int32Array(0));
const logits: Float32Array[] = Array.from({ length: SLOTS }, () => new Float32Array(0));
const sampled: Int32Array[] = Array.from({ length: SLOTS }, () => new Int32Array(0));
let version = 0;
let buffersArrived: (() => void) | null = null;
const read: ReadPlan = newReadPlan();

self.onmessage = (e) => {
  const m = e.data;
  if (m.type === "load") void load(m);
  else if (m.type === "buffers") {
    if (m.pool) {
      const p = m.pool;
      // The kernels know their memory by its own buffer objects, not the engine's copy of one.
      pool =
        p.inKernel && model ? model.kvPoolAt(p.shape, p.numBlocks, p.slabOffset) : new KvPool(p.shape, p.numBlocks, { slab: p.slab, slabOffset: p.slabOffset });
    }
    if (m.plan) plans[m.slot] = new Int32Array(m.plan);
    if (m.logits && model) {
      ({ logits: logits[m.slot]!, sampled: sampled[m.slot]! } = logitsViews(m.logits, model.cfg.vocabSize));
    }
    version = m.version;
    buffersArrived?.();
  } else if (m.type === "kv-slab") {
    self.postMessage({ type: "kv-slab", slab: model?.kvSlab(m.bytes) ?? null });
  } else {
    model?.close();
    process.exit(0);
  }
};

async function load(m: Extract<ToModelThread, { type: "load" }>): Promise<void> {
  try {
    const o = m.opts;
    const files = readModelFilesFor({ modelPath: o.modelPath, tokenizerPath: o.tokenizerPath, maxSeqLen: o.maxSeqLen, dtype: o.dtype });
    const weights = holdWeights(files.cfg, files.weights, files.stats.dtype, o.dtype);
    const t = new Transformer(files.cfg, weights, { threads: o.threads ?? 1 });
    await t.ready();
    model = t;
    ctrl = new Int32Array(m.ctrl, 0, CTRL_INTS);
    const stats = { ...files.stats, residentBytes: weightsBytes(weights) };
    self.postMessage({
      type: "loaded",
      info: { name: files.name, cfg: t.cfg, eosIds: files.eosIds, stats, dtype: t.dtype, threads: t.threads, kernels: t.kernels, memories: t.memories },
    });
  } catch (e) {
    self.postMessage({ type: "load-failed", message: e instanceof Error ? e.message : String(e) });
    return;
  }
  await serve(model);
}

/**
 * Runs each forward the engine posts, every gen in order, forever; a forward that throws fails
 * that step alone (and the next one, when it names tokens the failed one was to sample).
 */
async function serve(t: Transformer): Promise<void> {
  // From 0, not the current GEN: the engine may post its first forward before this loop starts.
  let seen = 0;
  let prev: Int32Array | null = null;
  const stats = statsCells(ctrl);
  // Row views of the slots' logits buffers, for sampleRows.
  const rows = new LogitsRows(t.cfg.vocabSize);
  for (;;) {
    if (Atomics.load(ctrl, GEN) === seen) {
      const idle = performance.now();
      stats[STAT_IDLE_WAITS]!++;
      Atomics.store(ctrl, IDLE, 1);
      // Read again after IDLE is up: a gen posted before then was posted without a notify.
      if (Atomics.load(ctrl, GEN) === seen) {
        const w = Atomics.waitAsync(ctrl, GEN, seen);
        if (w.async) await w.value;
      }
      Atomics.store(ctrl, IDLE, 0);
      stats[STAT_IDLE_MS]! += performance.now() - idle;
      if (Atomics.load(ctrl, GEN) === seen) continue;
    }
    const gen = (seen + 1) | 0;
    seen = gen;
    while (version < Atomics.load(ctrl, VER)) await new Promise<void>((resolve) => (buffersArrived = resolve));
    const slot = slotOf(gen);
    const start = performance.now();
    let failed = false;
    try {
      if (pool === null) throw new Error("model thread: forward before the engine shared its KV pool");
      const p = readPlan(plans[slot]!, prev, read);
      prev = null;
      t.forward(pool, p.chunks, logits[slot]!);
      sampleRows(p, logits[slot]!, rows, sampled[slot]!);
      prev = sampled[slot]!;
    } catch (e) {
      writeError(ctrl, slot, e instanceof Error ? e.message : String(e));
      Atomics.store(ctrl, FAILED + slot, gen);
      failed = true;
    }
    stats[STAT_BUSY_MS]! += performance.now() - start;
    Atomics.store(ctrl, DONE, gen);
    if (failed || ((gen - Atomics.load(ctrl, WAKE)) | 0) >= 0) {
      stats[STAT_NOTIFIES]!++;
      const notifyAt = performance.now();
      Atomics.notify(ctrl, DONE);
      stats[STAT_NOTIFY_MS]! += performance.now() - notifyAt;
    }
  }
}
