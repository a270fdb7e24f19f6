import assert from "node:assert";
import type { KernelExports } from "./matmul.ts";
import type { DType } from "./packed.ts";
import { StallBackoff } from "./stall-backoff.ts";

/**
 * Helper threads that take chunks of a dispatch's matmuls over the kernel's shared memory.
 *
 * Invariant: a dispatch is whole when `run` returns. Its jobs (a matmul each) are cut into chunks
 * of whole 8-row strips; every thread, the caller included, claims chunks until none are left
 * (kernels/assembly/dispatch.ts) and computes each whole, every dot product in the kernel's one
 * order, so outputs are the same bits whatever the thread count and whichever thread took a
 * chunk. A helper that is late, descheduled or never started only leaves more chunks to the
 * others; the caller waits only for chunks already claimed. Helpers spin briefly on the
 * generation counter, then sleep on it (Atomics.wait) with their WAITING flag up, so the caller
 * wakes only sleepers.
 */

// A queued job, as MatmulKernel writes it and the kernels take it.
export const J_FN = 0;
export const J_Y = 1;
export const J_X = 2;
export const J_W = 3;
export const J_ROWS = 4;
export const J_N = 5;
export const J_D = 6;
export const J_R0 = 7;
export const JOB_INTS = 8;
export const KERNEL_INDEX: Record<DType, number> = { f32: 0, f16: 1, bf16: 2, q8_0: 3 };
/**
 * An attention job's fn: J_W names its parameters (kernels/assembly/attention.ts), J_ROWS its
 * count of (sequence, KV head) pieces, each one chunk.
 */
export const J_ATTEND = 4;

// The control block in the shared memory, in i32 slots (dispatch.ts reads the same layout). The
// counters sit on cache lines of their own.
const GEN = 0;
const NEXT = 16;
const DONE = 32;
const TOTAL = 48;
const COUNT = 49;
const SCRATCH = 50;
const STRIDE = 51;
const WAITING = 52;
const HELPED = 53;
/** Set by a helper whose kernel call threw: its claimed chunk will never be done. */
const FAILED = 54;
const JOBS = 64;
/** fn, y, x, w, rows, n, d, r0, chunk rows, first chunk. */
const CTRL_JOB = 10;
const MAX_DISPATCH_JOBS = 8;
const SLEEPING = JOBS + MAX_DISPATCH_JOBS * CTRL_JOB;
/** Bytes of the control block for `helpers` helpers. */
export function controlBytes(helpers: number): number {
  return (SLEEPING + helpers + 1) * 4;
}
/** Chunks each job is cut into per thread at least: enough that a slow thread's share is taken over. */
const CHUNKS_PER_THREAD = 4;
/**
 * Multiply-adds a chunk of a one-row job holds at most: the threads finish a job at most one
 * chunk apart, so a big job (the classifier) is cut finer than CHUNKS_PER_THREAD alone would. A
 * job of r rows takes chunks min(r, CHUNK_ROWS_MAX) times as big: the claims (a cache line both
 * cores fight over) would otherwise multiply with the rows, which cost more than the wider gap
 * (8-13% of a batch-8 decode step, measured).
 */
const CHUNK_MACS = 1 << 16;
const CHUNK_ROWS_MAX = 4;
/** The caller spins this many times on DONE before sleeping on it. */
const SPINS = 20000;
/**
 * A helper spins this long (ms) after a dispatch before sleeping: a decode step hands out dozens
 * of dispatches with the caller's own work (attention, norms) between them, and a sleeping
 * helper wakes too late to take any of a small dispatch.
 */
const HELPER_SPIN_MS = 2;

/** Runs queued jobs whole on the calling thread. */
export function runJobs(ex: KernelExports, jobs: Int32Array, count: number, scratch: number): void {
  for (let j = 0, b = 0; j < count; j++, b += JOB_INTS) {
    if (jobs[b + J_FN] === J_ATTEND) {
      ex.attend_jobs(jobs[b + J_W]!, 0, jobs[b + J_ROWS]!, scratch);
      continue;
    }
    const r0 = jobs[b + J_R0]!;
    const fn = FNS[jobs[b + J_FN]!]!;
    ex[fn](jobs[b + J_Y]!, jobs[b + J_X]!, jobs[b + J_W]!, jobs[b + J_ROWS]!, jobs[b + J_N]!, jobs[b + J_D]!, r0, r0, r0 + jobs[b + J_D]!, scratch);
  }
}

const FNS = ["matmul_f32", "matmul_f16", "matmul_bf16", "matmul_q8_0"] as const;

// The helper's whole program. It is a string run from a Blob URL rather than a module file so a
// binary made by `bun build --compile` carries it without a second entry point. It instantiates
// the kernel module on the shared memory, then joins every dispatch it sees.
const HELPER_SOURCE = `
self.onmessage = (e) => {
  const { module, memory, ctrl, ints, thread } = e.data;
  const ex = new WebAssembly.Instance(module, { env: { memory } }).exports;
  const c = new Int32Array(memory.buffer, ctrl, ints);
  const sleeping = ${SLEEPING} + thread;
  let seen = Atomics.load(c, ${GEN});
  postMessage("ready");
  for (;;) {
    let idle = performance.now();
    for (let spins = 1; Atomics.load(c, ${GEN}) === seen; spins++) {
      if ((spins & 1023) === 0 && performance.now() - idle > ${HELPER_SPIN_MS}) {
        Atomics.store(c, sleeping, 1);
        Atomics.wait(c, ${GEN}, seen, 1000);
        Atomics.store(c, sleeping, 0);
        idle = performance.now();
      }
    }
    seen = Atomics.load(c, ${GEN});
    try {
      ex.run_chunks(ctrl, thread, seen);
    } catch (err) {
      Atomics.store(c, ${FAILED}, 1);
      Atomics.notify(c, ${DONE});
      throw err;
    }
  }
};
`;
let helperUrl: string | null = null;

export class KernelThreads {
  readonly helpers: number;
  private readonly ctrlAt: number;
  private readonly ctrl: Int32Array;
  private readonly workers: Worker[] = [];
  private gen = 0;
  /** A helper that lost its core mid-chunk keeps dispatches on the caller for a while. */
  private readonly backoff = new StallBackoff();
  /** Settles when every helper runs. */
  readonly ready: Promise<void>;

  /** `ctrlAt`: controlBytes(helpers) zeroed bytes of the memory, 64-byte aligned. */
  constructor(module: WebAssembly.Module, memory: WebAssembly.Memory, helpers: number, ctrlAt: number) {
    assert(Number.isInteger(helpers) && helpers >= 1 && helpers < 64, `helpers ${helpers}`);
    assert(ctrlAt % 64 === 0, `control block at ${ctrlAt}`);
    this.helpers = helpers;
    this.ctrlAt = ctrlAt;
    this.ctrl = new Int32Array(memory.buffer, ctrlAt, controlBytes(helpers) / 4);
    const started: Promise<void>[] = [];
    for (let h = 0; h < helpers; h++) {
      helperUrl ??= URL.createObjectURL(new Blob([HELPER_SOURCE], { type: "application/javascript" }));
      const w = new Worker(helperUrl);
      started.push(
        new Promise<void>((resolve, reject) => {
          w.addEventListener("message", () => resolve(), { once: true });
          w.addEventListener("error", (e) => reject(new Error(`kernel helper thread failed: ${e.message}`)), { once: true });
        }),
      );
      w.postMessage({ module, memory, ctrl: ctrlAt, ints: this.ctrl.length, thread: h + 1 });
      // Helpers never keep the process alive: an engine that stops exits.
      w.unref();
      this.workers.push(w);
    }
    this.ready = Promise.all(started).then(() => {});
    // A helper that failed to start never claims a chunk: the caller computes them all.
    this.ready.catch(() => {});
  }

  /** Chunks computed by helper threads so far (tests check the threads work). */
  get helperChunks(): number {
    return Atomics.load(this.ctrl, HELPED);
  }

  /** False while backing off after a stalled helper (StallBackoff): run the dispatch alone. */
  get available(): boolean {
    return this.backoff.available(performance.now());
  }

  /**
   * Runs `count` queued jobs on every thread that joins. Thread t's scratch is scratch + t * stride.
   * Blocks (spinning, then sleeping) until every chunk is done.
   */
  run(ex: KernelExports, jobs: Int32Array, count: number, scratch: number, stride: number): void {
    assert(count <= MAX_DISPATCH_JOBS, `dispatch of ${count} jobs`);
    const c = this.ctrl;
    const threads = this.helpers + 1;
    this.gen = (this.gen + 1) & 0x7fff;
    // Close claims first: a helper still finishing the last dispatch, which read NEXT before this
    // store, must fail its compare-and-swap rather than take a chunk of the new jobs written below.
    Atomics.store(c, NEXT, (this.gen << 16) | 0xffff);
    let total = 0;
    for (let j = 0; j < count; j++) {
      const b = j * JOB_INTS;
      const o = JOBS + j * CTRL_JOB;
      for (let i = 0; i < JOB_INTS; i++) c[o + i] = jobs[b + i]!;
      c[o + 9] = total;
      if (jobs[b + J_FN] === J_ATTEND) {
        total += jobs[b + J_ROWS]!;
        continue;
      }
      const r0 = jobs[b + J_R0]!;
      const span = r0 + jobs[b + J_D]! - (r0 & ~7);
      const rows = jobs[b + J_ROWS]!;
      const chunks = Math.max(threads * CHUNKS_PER_THREAD, Math.ceil((rows * jobs[b + J_N]! * span) / (CHUNK_MACS * Math.min(rows, CHUNK_ROWS_MAX))));
      const per = Math.max(8, Math.ceil(span / chunks / 8) * 8);
      c[o + 8] = per;
      total += Math.ceil(span / per);
    }
    assert(total < 65535, `dispatch of ${total} chunks`);
    c[COUNT] = count;
    c[SCRATCH] = scratch;
    c[STRIDE] = stride;
    Atomics.store(c, DONE, 0);
    Atomics.store(c, TOTAL, total);
    Atomics.store(c, NEXT, this.gen << 16);
    Atomics.store(c, GEN, this.gen);
    for (let h = 1; h <= this.helpers; h++) {
      if (Atomics.load(c, SLEEPING + h) !== 0) {
        Atomics.notify(c, GEN);
        break;
      }
    }
    ex.run_chunks(this.ctrlAt, 0, this.gen);
    if (Atomics.load(c, DONE) !== total) this.waitFor(total);
  }

  /** Waits for the helpers' last claimed chunks, and backs off if that took a stall. */
  private waitFor(total: number): void {
    const c = this.ctrl;
    const t0 = performance.now();
    for (let spins = 0; ; spins++) {
      const done = Atomics.load(c, DONE);
      if (done === total) break;
      if (done > total) assert.fail(`dispatch counted ${done} chunks done of ${total}`);
      if (Atomics.load(c, FAILED) !== 0) assert.fail(`kernel helper thread failed: ${total - done} of ${total} chunks never done`);
      if (spins > SPINS) {
        Atomics.store(c, WAITING, 1);
        Atomics.wait(c, DONE, done, 10);
        Atomics.store(c, WAITING, 0);
      }
    }
    const t = performance.now();
    this.backoff.note(t - t0, t);
  }

  /** Stops the helpers; the kernel then runs on the caller alone. */
  close(): void {
    for (const w of this.workers) w.terminate();
    this.workers.length = 0;
  }
}
