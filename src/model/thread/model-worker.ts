import type { TokenMatcher } from "../../grammar/index.ts";
import assert from "node:assert";
import type { KvPool } from "../../pool/index.ts";
import {
  CTRL_BYTES,
  CTRL_INTS,
  DONE,
  FAILED,
  type FromModelThread,
  GEN,
  IDLE,
  type LoadedInfo,
  logitsBufferBytes,
  logitsViews,
  type ModelThreadOptions,
  planInts,
  readError,
  type RowSampling,
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
  writePlan,
} from "./model-worker-protocol.ts";
import { dropFirst } from "./drop-first.ts";
import type { KvSlab, SeqChunk } from "../compute/index.ts";

// A compiled binary holds its entry points at the root of its own file system (Bun resolves a
// worker named relative to that root); from a checkout the thread is the file beside this one.
const THREAD_ENTRY = import.meta.url.includes("/$bunfs/")
  ? "./src/model/thread/model-worker-thread.ts"
  : new URL("./model-worker-thread.ts", import.meta.url).href;

/**
 * How a forward posted with ModelWorker.post ends: once, with the sampled rows' tokens (a view
 * valid until that slot's next forward is posted) or with the error that failed it.
 */
export type ForwardDone = (sampled: Int32Array | null, error: Error | null) => void;

/** A forward in flight: one record per slot, refilled for each forward posted to it. */
interface Pending {
  gen: number;
  done: ForwardDone;
  /** The caller's logits buffer when it is not the shared one: copied into on completion. */
  out: Float32Array | null;
  nLogits: number;
  /** The sampled rows' tokens, once the step is done. */
  sampled: Int32Array;
  /** The caller needn't hear of its end before the next forward's (wakeAt). */
  lazy: boolean;
}

/** ModelWorker.counters: totals since the thread started. */
export interface ModelThreadCounters {
  /** Milliseconds the model thread spent running forwards (and sampling their rows). */
  busyMs: number;
  /** Times it finished a forward and found none posted (it waited on the engine), and the milliseconds those waits took. */
  idleWaits: number;
  idleMs: number;
  /** Times it woke the engine's thread, and the milliseconds it spent doing so (STAT_NOTIFY_MS says why that is large). */
  notifies: number;
  notifyMs: number;
  /** Times the engine's thread woke to settle forwards. */
  wakes: number;
}

/**
 * A model on its own thread, behind the engine's model port (WorkerPort, src/engine): the thread loads the weights and
 * runs each forward over the engine's shared KV slab while the engine's event loop stays free.
 *
 * Invariant: at most SLOTS forwards are in flight, each in its own slot (slotOf(gen)), and while one
 * is the model thread alone touches its slot's plan and logits buffers; forwards settle in the
 * order they were posted. A thread that dies (or a close) fails every forward in flight and every
 * later one with `model worker died: ...`, so an engine never waits on a dead model.
 */
export class ModelWorker {
  readonly info: LoadedInfo;
  readonly vocabSize: number;
  /** Forwards post takes in flight at most. */
  readonly pipelineDepth = SLOTS;
  private readonly worker: Worker;
  private readonly ctrl: Int32Array;
  private gen = 0;
  private version = 0;
  private pool: KvPool | null = null;
  private readonly plans = Array.from({ length: SLOTS }, () => new Int32Array(new SharedArrayBuffer(0)));
  private readonly logits: Float32Array[] = Array.from({ length: SLOTS }, () => new Float32Array(0));
  private readonly sampled: Int32Array[] = Array.from({ length: SLOTS }, () => new Int32Array(0));
  /** Per slot: its forward's record (free while the slot has none in flight). */
  private readonly slotRecords: Pending[] = Array.from({ length: SLOTS }, () => ({
    gen: 0,
    done: () => {},
    out: null,
    nLogits: 0,
    sampled: new Int32Array(0),
    lazy: false,
  }));
  /** In flight, oldest first. */
  private readonly pending: Pending[] = [];
  /** Slabs the thread gave room for in its kernel memory (kvSlab). */
  private readonly kernelSlabs = new Set<ArrayBufferLike>();
  private dead: Error | null = null;
  private readonly stats: Float64Array;
  /** Times watch woke from a wait on DONE. */
  private wakes = 0;
  /** watch runs, or waits on DONE: a forward posted meanwhile needs no watch of its own. */
  private watching = false;
  /** The one handler of every wait's end (made once: a wake allocates only the wait's own promise). */
  private readonly onWake = (): void => {
    this.wakes++;
    this.watch();
  };
  private readonly deathListeners: ((e: Error) => void)[] = [];

  private constructor(worker: Worker, ctrl: Int32Array, info: LoadedInfo) {
    this.worker = worker;
    this.ctrl = ctrl;
    this.stats = statsCells(ctrl);
    this.info = info;
    this.vocabSize = info.cfg.vocabSize;
    worker.addEventListener("error", (e) => this.die(e.message || "uncaught error"));
    worker.addEventListener("close", () => this.die("thread exited"));
    worker.unref();
  }

  /** Starts a model thread and settles once it holds the model and its kernel threads run. */
  static start(opts: ModelThreadOptions): Promise<ModelWorker> {
    const worker = new Worker(THREAD_ENTRY);
    const ctrl = new Int32Array(new SharedArrayBuffer(CTRL_BYTES), 0, CTRL_INTS);
    return new Promise<ModelWorker>((resolve, reject) => {
      // Only until the model is loaded: from then on the instance watches the thread.
      const onError = (e: ErrorEvent) => done(`model worker failed to start: ${e.message}`);
      const onMessage = (e: MessageEvent<FromModelThread>) => {
        const m = e.data;
        done(m.type === "load-failed" ? m.message : null, m.type === "loaded" ? m.info : undefined);
      };
      const done = (why: string | null, info?: LoadedInfo) => {
        worker.removeEventListener("error", onError);
        worker.removeEventListener("message", onMessage);
        if (info) {
          resolve(new ModelWorker(worker, ctrl, info));
          return;
        }
        worker.terminate();
        reject(new Error(why ?? "model worker: unexpected message before its model loaded"));
      };
      worker.addEventListener("error", onError);
      worker.addEventListener("message", onMessage);
      worker.postMessage({ type: "load", opts, ctrl: ctrl.buffer } satisfies ToModelThread);
    });
  }

  /** The shared buffer the next forward writes logits into, grown to hold `nSeq` sequences. */
  logitsBuffer(nSeq: number): Float32Array {
    const slot = slotOf(this.gen + 1);
    const have = this.logits[slot]!;
    if (have.length < nSeq * this.vocabSize) {
      const cap = Math.max(nSeq, (2 * have.length) / this.vocabSize);
      const buffer = new SharedArrayBuffer(logitsBufferBytes(cap, this.vocabSize));
      ({ logits: this.logits[slot]!, sampled: this.sampled[slot]! } = logitsViews(buffer, this.vocabSize));
      this.send(slot, { logits: buffer });
    }
    return this.logits[slot]!;
  }

  /**
   * Runs one forward on the model thread, which may be posted again before the one before ends
   * (SLOTS in flight at most): `done` is called once the forward ends (forwards end in the order
   * posted; a thread already dead calls it at once), with the tokens of the rows `sampling`
   * names, sampled on the model thread by the engine's own sampler (-1 elsewhere; a view valid
   * until that slot's next forward is posted), so an engine settling a step makes nothing per
   * step. A chunk token prevToken(r) is row r's sampled token of the forward before. Until `done`
   * the caller must not free, reuse or write any block of `batch`. `lazy`: it may end together
   * with the next one (see the engine's StepBatch.lazy). Throws, calling nothing, when SLOTS
   * forwards are in flight or `out` is short. `done` may post the next forward.
   */
  post(
    pool: KvPool,
    batch: readonly SeqChunk[],
    out: Float32Array,
    sampling: readonly (RowSampling | null)[] | undefined,
    lazy: boolean,
    done: ForwardDone,
  ): void {
    if (this.dead) {
      done(null, this.dead);
      return;
    }
    if (this.pending.length >= SLOTS) assert.fail(`model worker: ${SLOTS} forwards already in flight (one engine per model thread)`);
    const nLogits = batch.length * this.vocabSize;
    if (out.length < nLogits) assert.fail(`out has ${out.length} floats, want ${nLogits}`);
    if (pool !== this.pool) this.sharePool(pool);
    const shared = this.logitsBuffer(batch.length);
    // Int32 like the cell it is stored in, so it wraps with it (2^31 steps is weeks of decode).
    const gen = (this.gen + 1) | 0;
    const slot = slotOf(gen);
    const ints = planInts(batch, pool.shape.blockTokens);
    if (this.plans[slot]!.length < ints) {
      this.plans[slot] = new Int32Array(new SharedArrayBuffer(Math.max(ints, 2 * this.plans[slot]!.length) * 4));
      this.send(slot, { plan: this.plans[slot]!.buffer });
    }
    writePlan(this.plans[slot]!, batch, pool.shape.blockTokens, sampling);
    this.gen = gen;
    const p = this.slotRecords[slot]!;
    p.gen = gen;
    p.done = done;
    p.out = out === shared ? null : out;
    p.nLogits = nLogits;
    // The same view while the batch keeps its size and the slot its buffer.
    if (p.sampled.length !== batch.length || p.sampled.buffer !== this.sampled[slot]!.buffer) p.sampled = this.sampled[slot]!.subarray(0, batch.length);
    p.lazy = lazy;
    this.pending.push(p);
    // Held while a forward runs, so a process with nothing else to do still waits for it.
    if (this.pending.length === 1) this.worker.ref();
    Atomics.store(this.ctrl, GEN, gen);
    if (Atomics.load(this.ctrl, IDLE) !== 0) Atomics.notify(this.ctrl, GEN);
    if (!this.watching) this.watch();
    // A waiter already asleep may now sleep past a lazy head (wakeAt): the thread reads WAKE after each end.
    else Atomics.store(this.ctrl, WAKE, this.wakeAt());
  }

  /**
   * Room for a KV pool of `bytes` in the model thread's kernel memories, where its attention
   * reads the blocks in place (build the pool with these as its segments); null when there is none.
   */
  kvSlab(bytes: number): Promise<KvSlab[] | null> {
    if (this.dead) return Promise.reject(this.dead);
    return new Promise<KvSlab[] | null>((resolve, reject) => {
      const onMessage = (e: MessageEvent<FromModelThread>) => {
        if (e.data.type !== "kv-slab") return;
        off();
        const s = e.data.slab;
        for (const r of s ?? []) this.kernelSlabs.add(r.slab);
        resolve(s);
      };
      const onDeath = (err: Error) => {
        off();
        reject(err);
      };
      const off = () => {
        this.worker.removeEventListener("message", onMessage);
        const i = this.deathListeners.indexOf(onDeath);
        if (i >= 0) this.deathListeners.splice(i, 1);
      };
      this.worker.addEventListener("message", onMessage);
      this.deathListeners.push(onDeath);
      this.worker.postMessage({ type: "kv-slab", bytes } satisfies ToModelThread);
    });
  }

  /** Milliseconds the model thread has spent running forwards so far (a decode's busy share: Δ busyMs / Δ wall time). */
  get busyMs(): number {
    return this.stats[STAT_BUSY_MS]!;
  }

  /** Where a decode's time went, as totals so far (a decode's are the differences; see ModelThreadCounters). */
  get counters(): ModelThreadCounters {
    const s = this.stats;
    return {
      busyMs: s[STAT_BUSY_MS]!,
      idleWaits: s[STAT_IDLE_WAITS]!,
      idleMs: s[STAT_IDLE_MS]!,
      notifies: s[STAT_NOTIFIES]!,
      notifyMs: s[STAT_NOTIFY_MS]!,
      wakes: this.wakes,
    };
  }

  /** Calls `listener` when the thread dies unasked (not on close). */
  onDeath(listener: (e: Error) => void): void {
    this.deathListeners.push(listener);
  }

  /** Stops the model thread; a forward in flight fails. */
  close(): void {
    if (this.dead) return;
    this.worker.postMessage({ type: "close" } satisfies ToModelThread);
    this.die("closed");
  }

  private sharePool(pool: KvPool): void {
    const segments = pool.segments.map((g) => {
      const slab = g.bytes.buffer;
      if (!(slab instanceof SharedArrayBuffer)) assert.fail("model worker: the KV pool's slab must be shared (new KvPool(shape, n, { shared: true }))");
      return { slab, slabOffset: g.bytes.byteOffset, firstLayer: g.firstLayer, nLayers: g.nLayers };
    });
    this.pool = pool;
    this.send(0, { pool: { shape: pool.shape, numBlocks: pool.total, segments, inKernel: segments.every((g) => this.kernelSlabs.has(g.slab)) } });
  }

  /** The vocabularies the thread has been sent (with the first constraint opened over each). */
  private readonly vocabsSent = new WeakSet<object>();

  /** The engine's ModelPort.openConstraint: the thread builds its twin of `matcher` before it reads a plan naming `id`. */
  openConstraint(id: number, matcher: TokenMatcher, replay: readonly number[]): void {
    if (this.dead) return;
    const vocab = this.vocabsSent.has(matcher.vocab) ? undefined : { encoded: matcher.vocab.encoded, stopIds: matcher.vocab.stopIds };
    this.vocabsSent.add(matcher.vocab);
    this.version++;
    const open = { id, kind: matcher.spec.kind, source: matcher.spec.source, replay: [...replay], ...(vocab ? { vocab } : {}) };
    this.worker.postMessage({ type: "constraint", version: this.version, open } satisfies ToModelThread);
    Atomics.store(this.ctrl, VER, this.version);
  }

  /** The engine's ModelPort.closeConstraint: no plan names `id` any more (one already posted finds none and samples unmasked). */
  closeConstraint(id: number): void {
    if (this.dead) return;
    this.worker.postMessage({ type: "constraint", version: this.version, close: id } satisfies ToModelThread);
  }

  private send(slot: number, buffers: Omit<Extract<ToModelThread, { type: "buffers" }>, "type" | "version" | "slot">): void {
    this.version++;
    this.worker.postMessage({ type: "buffers", version: this.version, slot, ...buffers } satisfies ToModelThread);
    Atomics.store(this.ctrl, VER, this.version);
  }

  /**
   * Settles the forwards in flight the model thread has finished, oldest first, then waits on
   * DONE for the next (onWake calls this again), until none is left. Each forward's `done` may
   * post another one, which this same pass then watches.
   */
  private watch(): void {
    this.watching = true;
    for (;;) {
      const head = this.pending[0];
      if (head === undefined) break;
      Atomics.store(this.ctrl, WAKE, this.wakeAt());
      const done = Atomics.load(this.ctrl, DONE);
      // gen - done in Int32, so the comparison survives the counters' wrap.
      if (((head.gen - done) | 0) > 0) {
        const w = Atomics.waitAsync(this.ctrl, DONE, done);
        if (w.async) {
          void w.value.then(this.onWake);
          return;
        }
        continue;
      }
      const slot = slotOf(head.gen);
      this.settle(Atomics.load(this.ctrl, FAILED + slot) === head.gen ? new Error(readError(this.ctrl, slot)) : null);
    }
    this.watching = false;
  }

  /**
   * The gen whose end wakes this thread: the oldest in flight, unless it is lazy and a step
   * behind the one woken for stays queued (so the model thread has work while this one
   * catches up): then the first one not lazy, at most the second newest.
   */
  private wakeAt(): number {
    const last = this.pending.length - 2;
    let i = 0;
    while (i < last && this.pending[i]!.lazy) i++;
    return this.pending[i]!.gen;
  }

  /** Settles the oldest forward in flight. */
  private settle(error: Error | null): void {
    const pending = this.pending;
    const p = pending[0];
    if (p === undefined) return;
    dropFirst(pending);
    if (this.pending.length === 0) this.worker.unref();
    if (error) {
      p.done(null, error);
      return;
    }
    if (p.out) p.out.set(this.logits[slotOf(p.gen)]!.subarray(0, p.nLogits));
    p.done(p.sampled, null);
  }

  private die(why: string): void {
    if (this.dead) return;
    this.dead = new Error(`model worker died: ${why}`);
    while (this.pending.length > 0) this.settle(this.dead);
    // Wakes the waiter of the forward that failed, so it lets go.
    Atomics.notify(this.ctrl, DONE);
    if (why === "closed") {
      // Time for the thread to stop its kernel helpers itself.
      setTimeout(() => this.worker.terminate(), 1000).unref();
      return;
    }
    this.worker.terminate();
    for (const listen of this.deathListeners) listen(this.dead);
  }
}
