import assert from "node:assert";
import type { KvPool } from "../pool/index.ts";
import {
  CTRL_BYTES,
  CTRL_INTS,
  DONE,
  FAILED,
  type FromModelThread,
  GEN,
  type LoadedInfo,
  type ModelThreadOptions,
  planInts,
  readError,
  type ToModelThread,
  VER,
  writePlan,
} from "./model-worker-protocol.ts";
import type { KvSlab, SeqChunk } from "./transformer.ts";

// A compiled binary holds its entry points at the root of its own file system (Bun resolves a
// worker named relative to that root); from a checkout the thread is the file beside this one.
const THREAD_ENTRY = import.meta.url.includes("/$bunfs/") ? "./src/model/model-worker-thread.ts" : new URL("./model-worker-thread.ts", import.meta.url).href;

interface Pending {
  gen: number;
  resolve: () => void;
  reject: (e: Error) => void;
  /** The caller's logits buffer when it is not the shared one: copied into on completion. */
  out: Float32Array | null;
  nLogits: number;
}

/**
 * A model on its own thread, as the engine's model runner: the thread loads the weights and
 * runs each forward over the engine's shared KV slab while the engine's event loop stays free.
 *
 * Invariant: at most one forward is in flight, and while it is the model thread alone touches
 * the plan and logits buffers. A thread that dies (or a close) fails the forward in flight and
 * every later one with `model worker died: ...`, so an engine never waits on a dead model.
 */
export class ModelWorker {
  readonly info: LoadedInfo;
  readonly vocabSize: number;
  private readonly worker: Worker;
  private readonly ctrl: Int32Array;
  private gen = 0;
  private version = 0;
  private pool: KvPool | null = null;
  private plan = new Int32Array(new SharedArrayBuffer(0));
  private logits = new Float32Array(new SharedArrayBuffer(0));
  private pending: Pending | null = null;
  /** Slabs the thread gave room for in its kernel memory (kvSlab). */
  private readonly kernelSlabs = new Set<ArrayBufferLike>();
  private dead: Error | null = null;
  private readonly deathListeners: ((e: Error) => void)[] = [];

  private constructor(worker: Worker, ctrl: Int32Array, info: LoadedInfo) {
    this.worker = worker;
    this.ctrl = ctrl;
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

  /** The shared buffer forward writes logits into, grown to hold `nSeq` sequences. */
  logitsBuffer(nSeq: number): Float32Array {
    if (this.logits.length < nSeq * this.vocabSize) {
      const cap = Math.max(nSeq, (2 * this.logits.length) / this.vocabSize);
      this.logits = new Float32Array(new SharedArrayBuffer(cap * this.vocabSize * 4));
      this.send({ logits: this.logits.buffer });
    }
    return this.logits;
  }

  /**
   * Runs one forward on the model thread; settles when its K/V are in the slab and its logits in
   * `out`. Until then the caller must not free, reuse or write any block of `batch`.
   */
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): Promise<void> {
    if (this.dead) return Promise.reject(this.dead);
    assert(this.pending === null, "model worker: a forward is already in flight (one engine per model thread)");
    const nLogits = batch.length * this.vocabSize;
    if (out.length < nLogits) assert.fail(`out has ${out.length} floats, want ${nLogits}`);
    if (pool !== this.pool) this.sharePool(pool);
    const shared = this.logitsBuffer(batch.length);
    const ints = planInts(batch, pool.shape.blockTokens);
    if (this.plan.length < ints) {
      this.plan = new Int32Array(new SharedArrayBuffer(Math.max(ints, 2 * this.plan.length) * 4));
      this.send({ plan: this.plan.buffer });
    }
    writePlan(this.plan, batch, pool.shape.blockTokens);
    // Int32 like the cell it is stored in, so it wraps with it (2^31 steps is weeks of decode).
    const gen = (this.gen = (this.gen + 1) | 0);
    return new Promise<void>((resolve, reject) => {
      this.pending = { gen, resolve, reject, out: out === shared ? null : out, nLogits };
      // Held while a forward runs, so a process with nothing else to do still waits for it.
      this.worker.ref();
      Atomics.store(this.ctrl, GEN, gen);
      Atomics.notify(this.ctrl, GEN);
      void this.awaitDone(gen);
    });
  }

  /**
   * Room for a KV pool's slab of `bytes` in the model thread's kernel memory, where its attention
   * reads the blocks in place (build the pool with these options); null when there is none.
   */
  kvSlab(bytes: number): Promise<KvSlab | null> {
    if (this.dead) return Promise.reject(this.dead);
    return new Promise<KvSlab | null>((resolve, reject) => {
      const onMessage = (e: MessageEvent<FromModelThread>) => {
        if (e.data.type !== "kv-slab") return;
        off();
        const s = e.data.slab;
        if (s !== null) this.kernelSlabs.add(s.slab);
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
    const slab = pool.slab;
    if (!(slab instanceof SharedArrayBuffer)) assert.fail("model worker: the KV pool's slab must be shared (new KvPool(shape, n, { shared: true }))");
    this.pool = pool;
    this.send({ pool: { shape: pool.shape, numBlocks: pool.total, slab, slabOffset: pool.slabOffset, inKernel: this.kernelSlabs.has(slab) } });
  }

  private send(buffers: Omit<Extract<ToModelThread, { type: "buffers" }>, "type" | "version">): void {
    this.version++;
    this.worker.postMessage({ type: "buffers", version: this.version, ...buffers } satisfies ToModelThread);
    Atomics.store(this.ctrl, VER, this.version);
  }

  private async awaitDone(gen: number): Promise<void> {
    for (;;) {
      const done = Atomics.load(this.ctrl, DONE);
      if (this.pending?.gen !== gen) return;
      if (done === gen) break;
      const w = Atomics.waitAsync(this.ctrl, DONE, done);
      if (w.async) await w.value;
    }
    this.settle(Atomics.load(this.ctrl, FAILED) === gen ? new Error(readError(this.ctrl)) : null);
  }

  private settle(error: Error | null): void {
    const p = this.pending;
    if (p === null) return;
    this.pending = null;
    this.worker.unref();
    if (error) {
      p.reject(error);
      return;
    }
    if (p.out) p.out.set(this.logits.subarray(0, p.nLogits));
    p.resolve();
  }

  private die(why: string): void {
    if (this.dead) return;
    this.dead = new Error(`model worker died: ${why}`);
    this.settle(this.dead);
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
