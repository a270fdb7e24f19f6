// The model thread's program (a Worker entry: `npm run build` names it beside bin/engine.ts). It
// loads the weights itself, so the engine's thread never holds them, then runs every forward the
// engine hands it over shared memory (model-worker-protocol.ts states the handshake).
import { KvPool } from "../../pool/index.ts";
import { holdWeights, Transformer, weightsBytes } from "../compute/index.ts";
import { LogitsRows } from "./logits-rows.ts";
import { readModelFilesFor } from "../load/index.ts";
import { ConstraintCompiler, type ConstraintKind, type TokenMatcher } from "../../grammar/index.ts";
import { applyTokenBitmask, sample } from "../../rng/index.ts";
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

/**
 * The thread's twin of a sequence's structured-output matcher (the engine's ModelPort.openConstraint):
 * `count` output tokens taken. Broken (it could not be built, or lost step with the sequence):
 * its rows are sampled unmasked, and the engine's own matcher, which takes every token too,
 * refuses the first the grammar does not allow and ends that sequence alone.
 */
interface Mirror {
  matcher: TokenMatcher | null;
  count: number;
  ready: Promise<void> | null;
  broken: boolean;
}
const mirrors = new Map<number, Mirror>();
let grammars: Promise<ConstraintCompiler> | null = null;
let maskScratch = new Int32Array(0);
let logitScratch = new Float32Array(0);

function openMirror(o: NonNullable<Extract<ToModelThread, { type: "constraint" }>["open"]>): void {
  if (o.vocab) grammars = ConstraintCompiler.create(o.vocab);
  const compiler = grammars;
  const mirror: Mirror = { matcher: null, count: 0, ready: null, broken: false };
  mirror.ready = (async () => {
    try {
      if (compiler === null) throw new Error("no vocabulary");
      const c = await compiler;
      const m = await c.matcher(await c.compile({ kind: o.kind as ConstraintKind, source: o.source }));
      mirror.matcher = m;
      for (const t of o.replay) if (!m.accept(t)) mirror.broken = true;
      mirror.count = o.replay.length;
    } catch (e) {
      mirror.broken = true;
      console.error(`model thread: structured output ${o.id} cannot be masked here: ${e instanceof Error ? e.message : String(e)}`);
    }
    mirror.ready = null;
    // Closed while it was being built.
    if (!mirrors.has(o.id)) mirror.matcher?.dispose();
  })();
  mirrors.set(o.id, mirror);
}

function closeMirror(id: number): void {
  const m = mirrors.get(id);
  mirrors.delete(id);
  if (m && m.ready === null) m.matcher?.dispose();
}

/** The plan's constrained rows' twins, built (the first step of each sequence may wait on its compile). */
async function mirrorsReady(p: ReadPlan): Promise<void> {
  for (let r = 0; r < p.sampling.length; r++) {
    const id = p.sampling[r]?.constraint ?? 0;
    if (id === 0) continue;
    const ready = mirrors.get(id)?.ready;
    if (ready) await ready;
  }
}

self.onmessage = (e) => {
  const m = e.data;
  if (m.type === "load") void load(m);
  else if (m.type === "buffers") {
    if (m.pool) {
      const p = m.pool;
      // The kernels know their memory by its own buffer objects, not the engine's copy of one.
      pool = p.inKernel && model ? model.kvPoolAt(p.shape, p.numBlocks, p.segments) : new KvPool(p.shape, p.numBlocks, { segments: p.segments });
    }
    if (m.plan) plans[m.slot] = new Int32Array(m.plan);
    if (m.logits && model) {
      ({ logits: logits[m.slot]!, sampled: sampled[m.slot]! } = logitsViews(m.logits, model.cfg.vocabSize));
    }
    version = m.version;
    buffersArrived?.();
  } else if (m.type === "constraint") {
    if (m.open) openMirror(m.open);
    if (m.close !== undefined) closeMirror(m.close);
    version = Math.max(version, m.version);
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
    const t = new Transformer(files.cfg, weights, { threads: o.threads ?? 1, hugePages: o.hugePages, groupBytes: o.groupBytes, kvPool: o.kvPool });
    await t.ready();
    model = t;
    ctrl = new Int32Array(m.ctrl, 0, CTRL_INTS);
    const stats = { ...files.stats, residentBytes: weightsBytes(weights) };
    self.postMessage({
      type: "loaded",
      info: {
        name: files.name,
        cfg: t.cfg,
        eosIds: files.eosIds,
        stats,
        dtype: t.dtype,
        threads: t.threads,
        kernels: t.kernels,
        memories: t.memories,
        hugePages: t.hugePages,
      },
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
      if (mirrors.size > 0) await mirrorsReady(p);
      t.forward(pool, p.chunks, logits[slot]!);
      sampleRows(p, logits[slot]!, rows, sampled[slot]!, constrainedRow);
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

/** sampleRows' way with a constrained row of the plan being run (`read`), made once. */
const constrainedRow = (r: number, logits: Float32Array): number => {
  const s = read.sampling[r]!;
  return sampleConstrained(mirrors.get(s.constraint ?? 0), read.chunks[r]!.tokens, s, logits);
};

/**
 * A constrained row: its twin first takes the row's input when that is the output token the
 * engine sampled itself (outputs - 1 taken so far), then masks a copy of the logits (the
 * buffer's stay raw, for logprobs) and samples it with the one draw any token takes; the twin
 * takes the token. Never throws: a twin that cannot mask samples unmasked (see Mirror).
 */
function sampleConstrained(mirror: Mirror | undefined, input: ArrayLike<number>, s: NonNullable<ReadPlan["sampling"][number]>, logits: Float32Array): number {
  const m = mirror?.matcher;
  const outputs = s.outputs ?? 0;
  if (!mirror || !m || mirror.broken || m.terminated) return sample(logits, s.cfg, s.rng);
  if (mirror.count === outputs - 1 && input.length > 0) {
    if (m.accept(input[input.length - 1]!)) mirror.count++;
    else mirror.broken = true;
  }
  if (mirror.broken || mirror.count !== outputs) {
    if (!mirror.broken) console.error(`model thread: structured output matcher at ${mirror.count} tokens, the row at ${outputs}`);
    mirror.broken = true;
    return sample(logits, s.cfg, s.rng);
  }
  if (logitScratch.length !== logits.length) logitScratch = new Float32Array(logits.length);
  if (maskScratch.length !== m.words) maskScratch = new Int32Array(m.words);
  logitScratch.set(logits);
  m.fillMask(maskScratch);
  const t = applyTokenBitmask(logitScratch, maskScratch) === 0 ? sample(logits, s.cfg, s.rng) : sample(logitScratch, s.cfg, s.rng);
  if (m.accept(t)) mirror.count++;
  else mirror.broken = true;
  return t;
}
