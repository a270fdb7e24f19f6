import assert from "node:assert";
import { J_D, J_FIRST, J_FN, J_N, J_PER, J_R0, J_ROWS, J_W, J_X, J_Y, JOB_INTS, type KernelExports } from "./kernel-exports.ts";
import type { DType } from "./packed.ts";
import { StallBackoff } from "./stall-backoff.ts";

/**
 * Helper threads that take chunks of a dispatch's matmuls over the kernel's shared memory.
 *
 * Invariant: a dispatch is whole when `run` returns. Its jobs (a matmul each) are cut into chunks
 * of whole 8-row strips (a chunk of a prefill's many token rows run a tile of them at a time:
 * TILE_X_BYTES), and the chunks into one contiguous range per thread; each thread, the
 * caller included, takes chunks from the front of its own range, then steals from the back of
 * the others' (kernels/assembly/dispatch.ts), and computes each whole, every dot product in the
 * kernel's one order, so outputs are the same bits whatever the thread count and whichever
 * thread took a chunk. A helper that is late, descheduled or never started only leaves its range
 * to the others; the caller waits only for chunks already claimed. Helpers spin briefly on the
 * generation counter, then sleep on it (Atomics.wait) with their SLEEPING flag up, so the caller
 * wakes only sleepers.
 */

/** Each dtype's kernel (dispatch.ts reads the same numbers; 4 is J_ATTEND). */
export const KERNEL_INDEX: Record<DType, number> = { f32: 0, f16: 1, bf16: 2, q8_0: 3, q4_k: 5, q6_k: 6, q4_0: 7, q4_1: 8, q5_0: 9, q5_1: 10, q5_k: 11 };
/**
 * The kernel of f16 weights placed in the shifted coding (f16-bits.ts' f16Shift), where none has
 * |w| >= 128: MatmulKernel places every such f16 matrix so, since an f16 subnormal widened the
 * plain way costs x86 a microcode assist per multiply (kernels/assembly/f16.ts' THE SHIFTED F16).
 * A kernel index like KERNEL_INDEX's, for no file's dtype.
 */
export const F16_SHIFTED = 16;
/**
 * An attention job's fn: J_W names its parameters (kernels/assembly/attention.ts), J_ROWS its
 * count of (sequence, KV head) pieces, each one chunk.
 */
export const J_ATTEND = 4;
/**
 * A conversion to q8_0's fn (kernels/assembly/convert.ts): J_Y the q8_0 rows, J_X the source
 * rows, J_W the source dtype (0 f32, 1 f16, 2 bf16), J_N the row length, J_D the rows (J_ROWS 1).
 */
export const J_CONVERT_Q8 = 12;
/**
 * A matrix's rows placed in the strip layout's fn (kernels/assembly/place-strips.ts): J_Y the
 * strips, J_X the rows as a file holds them (J_N weights each), J_W the dtype (KERNEL_INDEX), J_D
 * the rows (J_ROWS 1, J_R0 0).
 */
export const J_PLACE = 13;
/**
 * Token rows quantized for an integer kernel's fn (dispatch.ts' quantize_rows): J_Y the quantized
 * rows, J_X the f32 rows (J_N each), J_W the layout (1 q8_0, 2 K, 3 legacy), J_D the rows (J_ROWS
 * 1, J_R0 0).
 */
export const J_QUANT_X = 14;
/**
 * Fresh pages of the memory written to first (dispatch.ts' touch_pages), so a helper takes the
 * host's cost of a first touch off the thread that fills them: J_Y .. J_X the bytes, J_D their
 * 64 KiB spans (J_ROWS 1, J_R0 0), J_N TOUCH_N.
 */
export const J_TOUCH = 15;
/**
 * SwiGLU in place's fn (elementwise.ts' swiglu): J_Y the gates (h, f32), J_X the ups (g), J_W the
 * floats of each, cut as J_D rows of J_N (the last one short; J_ROWS 1, J_R0 0).
 */
export const J_SWIGLU = 17;
/**
 * A touch job's J_N: a span counts as TOUCH_N multiply-adds where KernelThreads cuts chunks
 * (CHUNK_MACS), so a chunk is 16 spans, 1 MiB: a handful of page faults, far from a tail.
 */
const TOUCH_N = 4096;

/** Writes a J_TOUCH job over bytes from .. to into the record j. */
export function writeTouchJob(j: Int32Array, from: number, to: number): void {
  writeRowsJob(j, J_TOUCH, from, to, 0, TOUCH_N, Math.ceil((to - from) / 65536));
}

/**
 * Writes a job over rows (J_CONVERT_Q8, J_PLACE, J_QUANT_X, J_TOUCH, J_SWIGLU) into the record j: y and x its output
 * and input, w what the kind reads there (a dtype or a layout), `rows` rows of n; J_ROWS 1 and
 * J_R0 0, so a dispatch cuts it by rows.
 */
export function writeRowsJob(j: Int32Array, fn: number, y: number, x: number, w: number, n: number, rows: number): void {
  j[J_FN] = fn;
  j[J_Y] = y;
  j[J_X] = x;
  j[J_W] = w;
  j[J_ROWS] = 1;
  j[J_N] = n;
  j[J_D] = rows;
  j[J_R0] = 0;
}

// The control block in the shared memory, in i32 slots (dispatch.ts reads the same layout). The
// counters, and each thread's range, sit on cache lines of their own.
const GEN = 0;
/**
 * Set by rest() (cleared by the next start): helpers sleep at once instead of spinning out
 * HELPER_SPIN_MS. On GEN's cache line, which a spinning helper reads anyway.
 */
const REST = 1;
const DONE = 16;
const TOTAL = 32;
const COUNT = 33;
const SCRATCH = 34;
const STRIDE = 35;
const WAITING = 36;
const HELPED = 37;
/** Set by a helper whose kernel call threw: its claimed chunk will never be done. */
const FAILED = 38;
const THREADS = 39;
/** dispatch.ts' tiles: the x bytes a tile reads at most (0: none), where the threads' tile job records start (TILE_JOB_BYTES apart). */
const TILE_X = 40;
const TILE_JOBS = 41;
const JOBS = 48;
/** A job record with J_PER and J_FIRST. */
const CTRL_JOB = J_FIRST + 1;
const MAX_DISPATCH_JOBS = 8;
/** Thread t's range, front << 16 | back, at RANGES + t * RANGE_INTS. */
const RANGES = 128;
const RANGE_INTS = 16;
const sleepingAt = (helpers: number): number => RANGES + RANGE_INTS * (helpers + 1);
/** Thread t's job record for its tiles (dispatch.ts' TILE_JOB_BYTES apart), a cache line each after the sleeping flags. */
const tileJobsAt = (helpers: number): number => Math.ceil((sleepingAt(helpers) + helpers + 1) / 16) * 16;
/** Bytes of the control block for `helpers` helpers. */
export function controlBytes(helpers: number): number {
  return (tileJobsAt(helpers) + 16 * (helpers + 1)) * 4;
}
/**
 * Multiply-adds of a chunk of a one-row job, at most: a job is cut into equal chunks no bigger.
 * Each chunk is a kernel call on rows that stream on from the owner's last, so the fewer the
 * better until the tail (the threads finish at most one chunk apart) costs more (bench/model.ts's
 * f16 decode on 2 threads is the figure to re-measure when changing it). A job of r rows takes chunks min(r, CHUNK_ROWS_MAX) times as big: a batch's
 * chunks cost as many calls at a fraction of the rows.
 */
const CHUNK_MACS = 1 << 16;
/**
 * A one-token matmul's chunk rows are a multiple of this: a strip (8 rows) for each of the four
 * runs dispatch.ts walks in step (THE STREAMS there); so are a q4_k batch's, whose kernel takes
 * four strips in step: adjacent ones from 8 rows (kquants.ts' matmulK), four streams as one token's
 * for 2 to 7 (kStreamsQ4Rows); every integer kernel's batches of 2 to 7 rows (kStreamsQ6Rows,
 * q8.ts' streamsRows, legacy.ts' streamsRows); and the 16-bit kernels' of 2 or 3 (matmul.ts'
 * streamsRows).
 */
const ONE_TOKEN_ROWS = 32;
/** The kernels whose weights meet quantized x in integers: 2 to 7 token rows of them walk THE STREAMS. */
const INTEGER_KERNELS = new Set((["q8_0", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1"] as const).map((d) => KERNEL_INDEX[d]));
/** The 16-bit kernels (f16 in either coding, bf16): 2 or 3 token rows of them walk THE STREAMS. */
const SIXTEEN_BIT_KERNELS = new Set([KERNEL_INDEX.f16, KERNEL_INDEX.bf16, F16_SHIFTED]);
const CHUNK_ROWS_MAX = 4;
/**
 * Token tiles (dispatch.ts): a chunk of a job whose x is over twice TILE_X_BYTES runs its kernel
 * a tile of token rows at a time (8 at least), each tile reading at most this much of x, so the
 * tile stays in a core's L2 (2 MB on the Xeon the figures come from) while the chunk's strips
 * sweep it (bench/prefill-tiles.ts's matmuls alone, process CPU time at load 3.9-5.4: 512 KB
 * gave q8_0 1.11-1.47x, q4_k 1.06-1.18x, q6_k 1.07-1.17x; 256 KB, 1 and 2 MB less). Such a
 * chunk takes rows whose weights fill about TILE_W_BYTES, which stay in L2 beside the tile from
 * one tile to the next, and at least TILED_CHUNKS per thread, so the threads still end together.
 * Only the integer kernels (KERNEL_INDEX 3 and up) take tiles (dispatch.ts says why).
 */
const TILE_X_BYTES = 1 << 19;
const TILE_W_BYTES = 1 << 19;
const TILED_CHUNKS = 6;
/** Bits of one weight in each kernel's strips (KERNEL_INDEX order): sizes a tiled chunk. */
const WEIGHT_BITS = [32, 16, 16, 8.5, 0, 4.625, 6.5625, 4.5, 5, 5.5, 6, 5.625];
/** Bytes of a job record for tiles (dispatch.ts' TILE_JOB_BYTES). */
export const TILE_JOB_BYTES = 64;

/** The token tiles' settings: one object a MatmulKernel shares with its threads. */
export class Tiles {
  /** false: every kernel call takes all its token rows at once (bench/prefill-tiles.ts' baseline). */
  on = true;
  /** TILE_X_BYTES and TILE_W_BYTES, for benches to sweep and tests to shrink. */
  xBytes = TILE_X_BYTES;
  wBytes = TILE_W_BYTES;

  /** The x bytes a tile reads at most; 0 when off (dispatch.ts' TILE_X). */
  get budget(): number {
    return this.on ? this.xBytes : 0;
  }
}

/** Rows of a tiled job's chunk: about `wBytes` of weights, and at least TILED_CHUNKS chunks per thread. */
function tiledPer(fn: number, n: number, span: number, threads: number, wBytes: number): number {
  const fill = Math.floor((wBytes * 8) / (n * WEIGHT_BITS[fn]!) / 8) * 8;
  return Math.max(8, Math.min(fill, Math.floor(span / (TILED_CHUNKS * threads) / 8) * 8));
}
/** A dispatch in which no chunk was claimed or counted for this long (ms) has lost one: the caller fails rather than hang. */
const LOST_CHUNK_MS = 10000;
/** The caller spins this many times on DONE before sleeping on it. */
const SPINS = 20000;
/**
 * A helper spins this long (ms) after a dispatch before sleeping: a decode step hands out dozens
 * of dispatches with the caller's own work (attention, norms) between them, and a sleeping
 * helper wakes too late to take any of a small dispatch.
 */
const HELPER_SPIN_MS = 2;

/**
 * Runs queued jobs whole on the calling thread. `jobs` is a view on the kernel's memory: each
 * matmul kernel takes its job record's address (jobs.byteOffset + 4 * b). With `tiles`, a matmul
 * whose x outgrows them runs in token tiles, their job record at `tileAt` (TILE_JOB_BYTES).
 */
export function runJobs(ex: KernelExports, jobs: Int32Array, count: number, scratch: number, tiles: Tiles | null = null, tileAt = 0): void {
  assert(jobs.buffer instanceof SharedArrayBuffer, "runJobs: the job records must be in the kernel's memory");
  for (let j = 0, b = 0; j < count; j++, b += JOB_INTS) {
    if (jobs[b + J_FN] === J_ATTEND) {
      ex.attend_jobs(jobs[b + J_W]!, 0, jobs[b + J_ROWS]!, scratch);
      continue;
    }
    if (jobs[b + J_FN] === J_CONVERT_Q8) {
      ex.convert_q8_rows(jobs[b + J_Y]!, jobs[b + J_X]!, jobs[b + J_W]!, jobs[b + J_N]!, 0, jobs[b + J_D]!);
      continue;
    }
    if (jobs[b + J_FN] === J_PLACE) {
      ex.place_rows(jobs[b + J_Y]!, jobs[b + J_X]!, jobs[b + J_W]!, jobs[b + J_N]!, jobs[b + J_D]!, 0, jobs[b + J_D]!);
      continue;
    }
    if (jobs[b + J_FN] === J_QUANT_X) {
      ex.quantize_rows(jobs[b + J_Y]!, jobs[b + J_X]!, jobs[b + J_W]!, jobs[b + J_N]!, 0, jobs[b + J_D]!, jobs[b + J_D]!);
      continue;
    }
    if (jobs[b + J_FN] === J_TOUCH) {
      ex.touch_pages(jobs[b + J_Y]!, jobs[b + J_X]!, 0, jobs[b + J_D]!);
      continue;
    }
    if (jobs[b + J_FN] === J_SWIGLU) {
      ex.swiglu(jobs[b + J_Y]!, jobs[b + J_X]!, jobs[b + J_W]!);
      continue;
    }
    const r0 = jobs[b + J_R0]!;
    const fn = jobs[b + J_FN]!;
    const n = jobs[b + J_N]!;
    const budget = tiles?.budget ?? 0;
    if (tiles !== null && tiled(ex, fn, n, jobs[b + J_ROWS]!, budget)) {
      // Token tiles on this thread too (dispatch.ts' matmul_tiled), in chunks of a dispatch's rows.
      const per = tiledPer(fn, n, r0 + jobs[b + J_D]! - (r0 & ~7), 1, tiles.wBytes);
      ex.matmul_tiled(jobs.byteOffset + 4 * b, scratch, tileAt, budget, per);
    } else if (jobs[b + J_ROWS] === 1) ex.matmul_one_token(jobs.byteOffset + 4 * b, ONE_TOKEN_ROWS, scratch);
    else ex[FNS[fn]!]!(jobs.byteOffset + 4 * b, r0, r0 + jobs[b + J_D]!, scratch);
  }
}

/** Whether dispatch.ts runs a matmul job's chunks in token tiles (it decides the same way). */
function tiled(ex: KernelExports, fn: number, n: number, rows: number, budget: number): boolean {
  // The integer matmul kernels only: KERNEL_INDEX q8_0 (3) and q4_k .. q5_k (5 .. 11).
  if (budget === 0 || fn < KERNEL_INDEX.q8_0 || fn === J_ATTEND || fn > KERNEL_INDEX.q5_k) return false;
  const xs = ex.x_row_bytes(fn, n);
  return rows > Math.max(8, Math.floor(budget / xs) & ~3) && rows * xs > 2 * budget;
}

/** Each kernel index's export, from KERNEL_INDEX (4, J_ATTEND, is not a matmul). */
const FNS: (`matmul_${DType}` | "matmul_f16s" | undefined)[] = [];
for (const [dt, i] of Object.entries(KERNEL_INDEX)) FNS[i] = `matmul_${dt as DType}`;
FNS[F16_SHIFTED] = "matmul_f16s";

// The helper's whole program. It is a string run from a Blob URL rather than a module file so a
// binary made by `bun build --compile` carries it without a second entry point. It instantiates
// the kernel module on the shared memory, then joins every dispatch it sees.
const HELPER_SOURCE = `
self.onmessage = (e) => {
  const { module, memory, ctrl, ints, thread, sleeping, spinMs } = e.data;
  const ex = new WebAssembly.Instance(module, { env: { memory } }).exports;
  const c = new Int32Array(memory.buffer, ctrl, ints);
  let seen = Atomics.load(c, ${GEN});
  postMessage("ready");
  for (;;) {
    let idle = performance.now();
    for (let spins = 1; Atomics.load(c, ${GEN}) === seen; spins++) {
      if ((spins & 1023) === 0 && (Atomics.load(c, ${REST}) !== 0 || performance.now() - idle > spinMs)) {
        Atomics.store(c, sleeping, 1);
        Atomics.wait(c, ${GEN}, seen, 1000);
        Atomics.store(c, sleeping, 0);
        idle = performance.now();
      }
    }
    seen = Atomics.load(c, ${GEN});
    try {
      ex.run_chunks(ctrl, thread);
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
  /** The token tiles' settings (the MatmulKernel's own object). */
  readonly tiles: Tiles;

  /**
   * `ctrlAt`: controlBytes(helpers) zeroed bytes of the memory, 64-byte aligned. `spinMs`: how long
   * a helper spins after a dispatch before sleeping (tests lengthen it to see rest() work).
   */
  constructor(module: WebAssembly.Module, memory: WebAssembly.Memory, helpers: number, ctrlAt: number, tiles: Tiles = new Tiles(), spinMs = HELPER_SPIN_MS) {
    assert(Number.isInteger(helpers) && helpers >= 1 && helpers < 64, `helpers ${helpers}`);
    assert(ctrlAt % 64 === 0, `control block at ${ctrlAt}`);
    assert(spinMs >= 0, `spinMs ${spinMs}`);
    this.helpers = helpers;
    this.ctrlAt = ctrlAt;
    this.tiles = tiles;
    this.ctrl = new Int32Array(memory.buffer, ctrlAt, controlBytes(helpers) / 4);
    this.ctrl[TILE_JOBS] = ctrlAt + tileJobsAt(helpers) * 4;
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
      w.postMessage({ module, memory, ctrl: ctrlAt, ints: this.ctrl.length, thread: h + 1, sleeping: sleepingAt(helpers) + h + 1, spinMs });
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

  /** Helpers asleep now (their SLEEPING flags up). */
  get sleepingHelpers(): number {
    let n = 0;
    for (let h = 1; h <= this.helpers; h++) n += Atomics.load(this.ctrl, sleepingAt(this.helpers) + h);
    return n;
  }

  /**
   * Sends the helpers to sleep now rather than after HELPER_SPIN_MS of spinning: the caller will
   * not dispatch here for a while. A model cut into layer groups has a KernelThreads per group,
   * and a group's helpers spinning on after the forward moved on take a core from the next
   * group's (two cores: 3 threads on 2 for 2 ms at every switch). The next start wakes them.
   */
  rest(): void {
    Atomics.store(this.ctrl, REST, 1);
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
    this.finish(ex, this.start(ex, jobs, count, scratch, stride));
  }

  /**
   * run's first half: the dispatch opened to the helpers, who start on it while the caller does
   * other work (MatmulKernel reads the next rows to place); `finish` with the returned chunk count
   * joins it. Nothing else may be dispatched in between.
   */
  start(ex: KernelExports, jobs: Int32Array, count: number, scratch: number, stride: number): number {
    assert(count <= MAX_DISPATCH_JOBS, `dispatch of ${count} jobs`);
    const c = this.ctrl;
    const threads = this.helpers + 1;
    // Every range is empty between dispatches (all chunks were claimed before DONE reached TOTAL),
    // so a helper still looking for chunks of the last one finds none while the jobs below are
    // rewritten; closing them again only guards that after a failed dispatch.
    for (let t = 0; t < threads; t++) Atomics.store(c, RANGES + t * RANGE_INTS, 0);
    c[TILE_X] = this.tiles.budget;
    // Before GEN moves: a helper that sees the new dispatch must not see the old rest.
    Atomics.store(c, REST, 0);
    const total = this.writeJobs(ex, jobs, count, threads);
    assert(total < 65535, `dispatch of ${total} chunks`);
    c[COUNT] = count;
    c[SCRATCH] = scratch;
    c[STRIDE] = stride;
    c[THREADS] = threads;
    Atomics.store(c, DONE, 0);
    Atomics.store(c, TOTAL, total);
    for (let t = 0; t < threads; t++) {
      Atomics.store(c, RANGES + t * RANGE_INTS, (Math.floor((t * total) / threads) << 16) | Math.floor(((t + 1) * total) / threads));
    }
    this.gen = (this.gen + 1) | 0;
    Atomics.store(c, GEN, this.gen);
    const sleeping = sleepingAt(this.helpers);
    for (let h = 1; h <= this.helpers; h++) {
      if (Atomics.load(c, sleeping + h) !== 0) {
        Atomics.notify(c, GEN);
        break;
      }
    }
    return total;
  }

  /** run's second half: the caller takes chunks of the dispatch `start` opened, then waits for the helpers' last. */
  finish(ex: KernelExports, total: number): void {
    const t0 = performance.now();
    const mine = ex.run_chunks(this.ctrlAt, 0);
    if (Atomics.load(this.ctrl, DONE) === total) return;
    // A caller that took none of its own range started late, not a helper: nothing to judge (-1).
    this.waitFor(total, mine === 0 ? -1 : (performance.now() - t0) / mine);
  }

  /**
   * Copies the jobs into the control block with each one's chunk rows and first chunk; returns
   * the dispatch's chunks over `threads`. An attention job is one chunk per piece.
   */
  private writeJobs(ex: KernelExports, jobs: Int32Array, count: number, threads: number): number {
    const c = this.ctrl;
    let total = 0;
    for (let j = 0; j < count; j++) {
      const b = j * JOB_INTS;
      const o = JOBS + j * CTRL_JOB;
      for (let i = 0; i < JOB_INTS; i++) c[o + i] = jobs[b + i]!;
      c[o + J_FIRST] = total;
      const rows = jobs[b + J_ROWS]!;
      const fn = jobs[b + J_FN]!;
      if (fn === J_ATTEND) {
        total += rows;
        continue;
      }
      const r0 = jobs[b + J_R0]!;
      const n = jobs[b + J_N]!;
      const span = r0 + jobs[b + J_D]! - (r0 & ~7);
      let per: number;
      if (tiled(ex, fn, n, rows, c[TILE_X]!)) per = tiledPer(fn, n, span, threads, this.tiles.wBytes);
      else {
        // A thread's chunk at least, so that even a job alone at the split threshold is shared.
        const chunks = Math.max(threads, Math.ceil((rows * n * span) / (CHUNK_MACS * Math.min(rows, CHUNK_ROWS_MAX))));
        const oneToken = rows === 1 && fn !== J_CONVERT_Q8 && fn !== J_PLACE && fn !== J_QUANT_X && fn !== J_TOUCH && fn !== J_SWIGLU;
        // 2 to 7 rows of an integer kernel, 2 or 3 of a 16-bit one, walk THE STREAMS as one token
        // does (dispatch.ts' runChunk).
        const smallStreams = rows >= 2 && (INTEGER_KERNELS.has(fn) ? rows < 8 : SIXTEEN_BIT_KERNELS.has(fn) && rows < 4);
        const unit = oneToken || smallStreams || (rows >= 8 && fn === KERNEL_INDEX.q4_k) ? ONE_TOKEN_ROWS : 8;
        per = Math.ceil(span / chunks / unit) * unit;
      }
      c[o + J_PER] = per;
      total += Math.ceil(span / per);
    }
    return total;
  }

  /**
   * Waits for the helpers' last claimed chunks, and backs off if that took a stall (StallBackoff;
   * chunkMs the caller's time a chunk, negative: not judged).
   */
  private waitFor(total: number, chunkMs: number): void {
    const c = this.ctrl;
    const t0 = performance.now();
    let last = -1;
    let since = t0;
    for (let spins = 0; ; spins++) {
      const done = Atomics.load(c, DONE);
      if (done === total) break;
      if (done > total) assert.fail(`dispatch counted ${done} chunks done of ${total}`);
      if (Atomics.load(c, FAILED) !== 0) assert.fail(`kernel helper thread failed: ${total - done} of ${total} chunks never done`);
      if (spins > SPINS) {
        Atomics.store(c, WAITING, 1);
        Atomics.wait(c, DONE, done, 10);
        Atomics.store(c, WAITING, 0);
        // A chunk takes milliseconds at most, and a thread counts its chunks in DONE only when it
        // is out of them: every claim moves a range word, so no claim nor count for this long is
        // a lost chunk, not a slow helper.
        const now = performance.now();
        const progress = this.progress(done);
        if (progress !== last) {
          last = progress;
          since = now;
        } else if (now - since > LOST_CHUNK_MS) assert.fail(`dispatch stuck at ${done} of ${total} chunks done for ${LOST_CHUNK_MS} ms`);
      }
    }
    const t = performance.now();
    if (chunkMs >= 0) this.backoff.note(t - t0, t, chunkMs);
  }

  /** A number that changes with every claim and every count of a dispatch (DONE at `done`). */
  private progress(done: number): number {
    let p = done;
    for (let t = 0; t <= this.helpers; t++) p = (Math.imul(p, 31) + Atomics.load(this.ctrl, RANGES + t * RANGE_INTS)) | 0;
    return p;
  }

  /** Stops the helpers; the kernel then runs on the caller alone. */
  close(): void {
    for (const w of this.workers) w.terminate();
    this.workers.length = 0;
  }
}
