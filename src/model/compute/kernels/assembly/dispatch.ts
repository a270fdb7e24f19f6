// One dispatch of matmuls, or of attention, shared by every thread (built with matmul.ts into one
// module).
//
// The caller writes the dispatch into a control block in the shared memory. Its jobs (a matmul
// each, a Job record of job.ts, which each kernel takes a pointer to) are cut into chunks of whole 8-row strips, numbered across the jobs in order, and the
// chunks into one contiguous range per thread, each range a word of its own cache line:
// front << 16 | back. A thread takes chunks from the front of its own range, so it streams
// through its rows in order and its claims stay in its own cache; when its range is empty it
// steals from the back of the others', one chunk at a time, so a thread that is late,
// descheduled or never started only leaves its range to the rest. Every claim is a
// compare-and-swap of a range word; each chunk is computed whole and counted in DONE (by each
// thread once it finds no chunk left), and the dispatch is over when DONE reaches TOTAL. Which thread computes a chunk never changes a bit of
// it (kernels/assembly/matmul.ts). An integer kernel's chunk over more token rows than a tile
// holds (TILE_X bytes of quantized x) runs a tile at a time: its strips sweep one tile of x, which
// stays in L2, where the whole x (4-9 MB in a 512-token prefill at dim 2048) was read from beyond
// it once per strip; each output is still one whole dot product, so the tiles change no bit. An attention job (fn ATTEND, its parameters at w) is cut into
// one chunk per piece (a sequence's KV heads), each computed whole (kernels/assembly/attention.ts).
//
// The caller closes every range (front = back) before writing a new dispatch and opens them
// after, so a thread still looking for chunks of the last dispatch either finds none or claims a
// chunk of the new one, fully written by then (seq-cst atomics order the plain stores before
// the opening): it reads the job, the scratch and the counters only after its claim.

import { attend_jobs } from "./attention";
import { convert_q8_rows } from "./convert";
import { swiglu } from "./elementwise";
import { place_rows } from "./place-strips";
import { BF16, F16, F16S, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 } from "./dtype-index";
import { Job } from "./job";
import { forgetScaledX, matmul_bf16, matmul_f16, matmul_f16s, matmul_f32, matmul_float_streams } from "./matmul";
import { k_row_bytes, matmul_k_streams, matmul_q4_k, matmul_q5_k, matmul_q6_k, quantize_k_x } from "./kquants";
import { l_row_bytes, matmul_legacy_streams, matmul_q4_0, matmul_q4_1, matmul_q5_0, matmul_q5_1, quantize_l_x } from "./legacy";
import { matmul_q8_0, matmul_q8_0_streams, q8_row_bytes, quantize_q8_rows } from "./q8";

// Control block, in i32 slots (kernel-threads.ts writes the same layout).
const DONE: usize = 16 << 2;
const TOTAL: usize = 32 << 2;
const COUNT: usize = 33 << 2;
const SCRATCH: usize = 34 << 2;
const STRIDE: usize = 35 << 2;
const WAITING: usize = 36 << 2;
const HELPED: usize = 37 << 2;
const THREADS: usize = 39 << 2;
/** Bytes of token rows (x) a tile of a chunk reads, at most; 0: no tiles (kernel-threads.ts' TILE_X_BYTES). */
const TILE_X: usize = 40 << 2;
/** Where thread t's job record for a tile is: TILE_JOBS' value + t * TILE_JOB_BYTES. */
const TILE_JOBS: usize = 41 << 2;
const TILE_JOB_BYTES: usize = 64;
const JOBS: usize = 48 << 2;
/** Thread t's range word at RANGES + t * RANGE_BYTES (a cache line each). */
const RANGES: usize = 128 << 2;
const RANGE_BYTES: usize = 64;
/** A job record's bytes in the control block (job.ts: fn .. first). */
const JOB_BYTES: usize = offsetof<Job>();
const ATTEND: i32 = 4;
/** A conversion to q8_0 (convert.ts): y the q8_0 rows, x the source rows, w the source dtype, d the rows. */
const CONVERT_Q8: i32 = 12;
/** A matrix's rows placed in strips (place-strips.ts): y the strips, x the rows, w the dtype, d the rows. */
const PLACE: i32 = 13;
/** Token rows quantized for an integer kernel (quantize_rows): y the quantized rows, x the f32 rows, w the layout, d the rows. */
const QUANT_X: i32 = 14;
/** Memory's pages first touched (touch_pages): bytes y .. x, d its 64 KiB spans. */
const TOUCH: i32 = 15;
/** SwiGLU in place (elementwise.ts' swiglu): y the gates' f32 (h), x the ups' (g), w of each in all, cut in d spans of n. */
const SWIGLU: i32 = 17;
/** Runs a one-token chunk walks in step (THE STREAMS). */
const STREAMS: i32 = 4;
/** Bytes from one touch to the next: the smallest page of the host (4 KiB on x86 and most arm64). */
const OS_PAGE: usize = 4096;

/**
 * Spans s0 .. s1 of 64 KiB from `from` (bytes below `to` only) written to without a change: an
 * atomic add of 0 to one word a 4 KiB page. The host allocates (and zeroes) a fresh page at its
 * first write, and a write racing this one on another thread (the page being filled) loses
 * nothing: the add is atomic and adds nothing.
 */
export function touch_pages(from: usize, to: usize, s0: i32, s1: i32): void {
  const end = min(to, from + (<usize>s1 << 16));
  for (let p = (from + (<usize>s0 << 16)) & ~3; p < end; p += OS_PAGE) atomic.add<i32>(p, 0);
}

/**
 * Token rows r0 .. r1 of the `rows` rows of n f32 at x quantized into dst (row 0's place) in the
 * layout an integer kernel reads: layout 1 q8.ts's (where a row's place depends on how many
 * there are), 2 kquants.ts's, 3 legacy.ts's. Each row is quantized alone, so any split of the
 * rows gives the same bytes.
 */
export function quantize_rows(dst: usize, x: usize, layout: i32, n: i32, r0: i32, r1: i32, rows: i32): void {
  if (r1 <= r0) return;
  if (layout == 1) {
    quantize_q8_rows(dst, x, r0, r1, rows, n);
    return;
  }
  const rb: usize = layout == 2 ? <usize>k_row_bytes(n) : <usize>l_row_bytes(n);
  const d = dst + <usize>r0 * rb;
  const s = x + ((<usize>r0 * <usize>n) << 2);
  if (layout == 2) quantize_k_x(d, s, r1 - r0, n);
  else quantize_l_x(d, s, r1 - r0, n);
}

/** Computes chunk c of the job at `job` (its chunks start at its `first`) on this thread. */
@inline function runChunk(ctrl: usize, thread: i32, job: usize, c: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const fn = j.fn;
  const k = c - j.first;
  const per = j.per;
  const oneToken = j.rows == 1 && per % (8 * STREAMS) == 0;
  // The integer kernels against 2 to 7 token rows walk THE STREAMS too (kquants.ts'
  // kStreamsQ4Rows.., q8.ts' streamsRows, legacy.ts' streamsRows), and the 16-bit ones against 2
  // or 3 (matmul.ts' streamsRows); kernel-threads.ts cuts their chunks so.
  const small = (fn == Q8_0 || (fn >= Q4_K && fn <= Q5_K)) ? j.rows < 8 : (fn == F16 || fn == F16S || fn == BF16) && j.rows < 4;
  const streams = oneToken || (small && j.rows >= 2 && per % (8 * STREAMS) == 0);
  // Every kernel but an f16 walk of THE STREAMS may write the scratch (matmul.ts' THE SCALED X A THREAD KEEPS).
  if (!(streams && (fn == F16 || fn == F16S))) forgetScaledX();
  if (fn == ATTEND) {
    attend_jobs(j.w, k, k + 1, scratch);
    return;
  }
  if (fn == CONVERT_Q8) {
    convert_q8_rows(j.y, j.x, <i32>j.w, j.n, k * per, min(j.d, (k + 1) * per));
    return;
  }
  if (fn == PLACE) {
    place_rows(j.y, j.x, <i32>j.w, j.n, j.d, k * per, min(j.d, (k + 1) * per));
    return;
  }
  if (fn == QUANT_X) {
    quantize_rows(j.y, j.x, <i32>j.w, j.n, k * per, min(j.d, (k + 1) * per), j.d);
    return;
  }
  if (fn == TOUCH) {
    touch_pages(j.y, j.x, k * per, min(j.d, (k + 1) * per));
    return;
  }
  if (fn == SWIGLU) {
    // Elementwise: any cut gives the same bits.
    const e0 = k * per * j.n;
    const e1 = min(<i32>j.w, (k + 1) * per * j.n);
    if (e1 > e0) swiglu(j.y + (<usize>e0 << 2), j.x + (<usize>e0 << 2), e1 - e0);
    return;
  }
  const r0 = j.r0;
  const base = r0 & ~7;
  if (streams) {
    oneTokenChunk(fn, job, k, per, scratch);
    return;
  }
  const g0 = max(r0, base + k * per);
  const g1 = min(r0 + j.d, base + (k + 1) * per);
  const tj = <usize>load<i32>(ctrl + TILE_JOBS) + <usize>thread * TILE_JOB_BYTES;
  matmulTiles(fn, job, g0, g1, scratch, tj, <usize>load<i32>(ctrl + TILE_X));
}

/**
 * THE STREAMS. Chunk k (per rows) of a one-token matmul job: piece k (per / STREAMS rows) of each
 * of the job's STREAMS parts, far rows apart, so a thread that takes its chunks in order walks
 * STREAMS long runs of the matrix in step, each from where its last chunk left it. One run a thread
 * (strip after strip) leaves a Xeon core waiting on each new line: its L2 prefetcher runs only
 * so far ahead of one stream, within a 4 KiB page; four chunk-long runs in step (the walk of two
 * rounds ago) lose the AMD EPYC's prefetchers, which drop runs that start anew every strip. Long
 * runs in step (bench/decode-ab.ts, 2 threads, Intel Xeon, against one run: 1B Q4_K_M 66.5 ->
 * 56.3 ms a token, Q8_0 99.4 -> 85.4, F16 308.8 -> 158.2, Q4_0 87.7 -> 49.7, 8B Q4_K_M 354.2
 * -> 307.2). Pieces wholly in the job go to the kernels' in-step walk (each row's sum in its own
 * order, so no bit changes); a piece cut by the job's ends goes alone.
 */
@inline function oneTokenChunk(fn: i32, job: usize, k: i32, per: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const r0 = j.r0;
  const base = r0 & ~7;
  const end = r0 + j.d;
  const p = per / STREAMS;
  const far = ((end - base + per - 1) / per) * p;
  const s0 = base + k * p;
  if (s0 >= r0 && s0 + (STREAMS - 1) * far + p <= end) {
    matmulStreams(fn, job, s0, s0 + p, far, scratch);
    return;
  }
  forgetScaledX();
  for (let t = 0; t < STREAMS; t++) {
    const a = max(r0, s0 + t * far);
    const b = min(end, s0 + t * far + p);
    if (a < b) matmulFn(fn, job, a, b, scratch);
  }
}

/** A one-token matmul job whole on this thread (kernel-threads.ts' runJobs), as a dispatch's chunks of `per` rows (a multiple of 8 STREAMS) would take it. */
export function matmul_one_token(job: usize, per: i32, scratch: usize): void {
  const j = changetype<Job>(job);
  const span = j.r0 + j.d - (j.r0 & ~7);
  const chunks = (span + per - 1) / per;
  // x may have changed in place since this thread last scaled it (matmul.ts' THE SCALED X A THREAD KEEPS).
  forgetScaledX();
  for (let k = 0; k < chunks; k++) oneTokenChunk(j.fn, job, k, per, scratch);
}

/**
 * Rows g0 .. g1 of the matmul job at `job`, in token tiles of at most `budget` bytes of x when its
 * x is over twice that (kernel-threads.ts' `tiled` decides the same way), each tile's job record
 * written at tj (this thread's own); whole otherwise.
 */
@inline function matmulTiles(fn: i32, job: usize, g0: i32, g1: i32, scratch: usize, tj: usize, budget: usize): void {
  const j = changetype<Job>(job);
  const rows = j.rows;
  const xs = xRowBytes(fn, j.n);
  const tile = max(8, <i32>(budget / xs) & ~3);
  // Only the integer kernels: their x is quantized (10.1 bytes an element for q8_0, 4.3 for
  // the quads), and the f32-x kernels re-widen each strip per tile (bench/prefill-tiles.ts: f16
  // gained nothing). Only an x of more than twice the budget: a decode batch's few rows stay in
  // L2 whole.
  if (budget == 0 || fn < 3 || fn == F16S || rows <= tile || <usize>rows * xs <= budget << 1) {
    matmulFn(fn, job, g0, g1, scratch);
    return;
  }
  // Token tiles: the chunk's strips sweep one tile of x while it stays in L2 (a 512-token prefill's
  // quantized x is 4-9 MB); each output is still one whole dot product of THE ORDER, so the
  // tiles change no bit. The tile's job is a copy with x, y and rows moved (a queued record has
  // no per and first, which no kernel reads).
  const t = changetype<Job>(tj);
  memory.copy(tj, job, offsetof<Job>("per"));
  const ys = <usize>j.d << 2;
  for (let r = 0; r < rows; r += tile) {
    t.x = j.x + <usize>r * xs;
    t.y = j.y + <usize>r * ys;
    t.rows = min(tile, rows - r);
    matmulFn(fn, tj, g0, g1, scratch);
  }
}

/**
 * The whole matmul job at `job` on this thread (kernel-threads.ts' runJobs): its rows in blocks of
 * `per` (whole strips, as a dispatch's chunks), each in token tiles of `budget` bytes of x as
 * matmulTiles cuts them, the tiles' job record at tj.
 */
export function matmul_tiled(job: usize, scratch: usize, tj: usize, budget: i32, per: i32): void {
  const j = changetype<Job>(job);
  const fn = j.fn;
  const r0 = j.r0;
  const base = r0 & ~7;
  const end = r0 + j.d;
  for (let k = 0; base + k * per < end; k++) {
    matmulTiles(fn, job, max(r0, base + k * per), min(end, base + (k + 1) * per), scratch, tj, <usize>budget);
  }
}

/** Bytes from one token row of a kernel's x to the next: f32 rows, or the integer kernels' quantized ones. */
@inline function xRowBytes(fn: i32, n: i32): usize {
  if (fn < Q8_0 || fn == F16S) return <usize>n << 2;
  if (fn == Q8_0) return <usize>q8_row_bytes(n);
  if (fn == Q4_K || fn == Q6_K || fn == Q5_K) return <usize>k_row_bytes(n);
  return <usize>l_row_bytes(n);
}

/** xRowBytes for TypeScript: MatmulKernel sizes quantized x and KernelThreads decides tiles by it. */
export function x_row_bytes(fn: i32, n: i32): i32 {
  return <i32>xRowBytes(fn, n);
}

/** Whole strips g0 .. g1 of a one-token job and the three pieces far rows after each, in step (all in the job). */
@inline function matmulStreams(fn: i32, job: usize, g0: i32, g1: i32, far: i32, scratch: usize): void {
  if (fn == Q8_0) matmul_q8_0_streams(job, g0, g1, far);
  else if (fn == Q4_K || fn == Q5_K || fn == Q6_K) matmul_k_streams(fn, job, g0, g1, far, scratch);
  else if (fn >= Q4_0 && fn <= Q5_1) matmul_legacy_streams(fn, job, g0, g1, far);
  else matmul_float_streams(fn, job, g0, g1, far, scratch);
}

@inline function matmulFn(fn: i32, job: usize, g0: i32, g1: i32, scratch: usize): void {
  if (fn == F32) matmul_f32(job, g0, g1, scratch);
  else if (fn == F16) matmul_f16(job, g0, g1, scratch);
  else if (fn == F16S) matmul_f16s(job, g0, g1, scratch);
  else if (fn == BF16) matmul_bf16(job, g0, g1, scratch);
  else if (fn == Q8_0) matmul_q8_0(job, g0, g1, scratch);
  else if (fn == Q4_K) matmul_q4_k(job, g0, g1, scratch);
  else if (fn == Q6_K) matmul_q6_k(job, g0, g1, scratch);
  else if (fn == Q4_0) matmul_q4_0(job, g0, g1, scratch);
  else if (fn == Q4_1) matmul_q4_1(job, g0, g1, scratch);
  else if (fn == Q5_0) matmul_q5_0(job, g0, g1, scratch);
  else if (fn == Q5_1) matmul_q5_1(job, g0, g1, scratch);
  else matmul_q5_k(job, g0, g1, scratch);
}

/** Takes the front chunk of the range word at r; -1 when the range is empty. */
@inline function claimFront(r: usize): i32 {
  let v = atomic.load<i32>(r);
  while ((v >>> 16) < (v & 0xffff)) {
    const seen = atomic.cmpxchg<i32>(r, v, v + 0x10000);
    if (seen == v) return v >>> 16;
    v = seen;
  }
  return -1;
}

/** Takes the back chunk of the range word at r; -1 when the range is empty. */
@inline function claimBack(r: usize): i32 {
  let v = atomic.load<i32>(r);
  while ((v >>> 16) < (v & 0xffff)) {
    const seen = atomic.cmpxchg<i32>(r, v, v - 1);
    if (seen == v) return (v & 0xffff) - 1;
    v = seen;
  }
  return -1;
}

/** A chunk for `thread`: its own range's front, else another's back (the next thread's first); -1 when none is left. */
@inline function claim(ctrl: usize, thread: i32): i32 {
  const c = claimFront(ctrl + RANGES + <usize>thread * RANGE_BYTES);
  if (c >= 0) return c;
  const threads = atomic.load<i32>(ctrl + THREADS);
  for (let k = 1; k < threads; k++) {
    const victim = (thread + k) % threads;
    const s = claimBack(ctrl + RANGES + <usize>victim * RANGE_BYTES);
    if (s >= 0) return s;
  }
  return -1;
}

/**
 * Claims and computes chunks until none are left; `thread` picks the range and the scratch.
 * Counts them in DONE once, on the way out: per chunk, DONE's cache line would cross between the
 * cores every chunk. A thread's chunks all belong to one dispatch, since the next opens only
 * when DONE is whole, after this thread's last claim failed. Returns the chunks computed.
 */
export function run_chunks(ctrl: usize, thread: i32): i32 {
  let done = 0;
  // A new dispatch: x may have changed in place since this thread last scaled it (matmul.ts' THE SCALED X A THREAD KEEPS).
  forgetScaledX();
  for (;;) {
    const c = claim(ctrl, thread);
    if (c < 0) break;
    // Read after the claim: the dispatch the chunk belongs to is the one written before its range opened.
    const scratch = <usize>load<i32>(ctrl + SCRATCH) + <usize>(thread * load<i32>(ctrl + STRIDE));
    const count = load<i32>(ctrl + COUNT);
    let job = ctrl + JOBS;
    for (let j = 1; j < count && changetype<Job>(job + JOB_BYTES).first <= c; j++) job += JOB_BYTES;
    runChunk(ctrl, thread, job, c, scratch);
    done++;
  }
  if (done == 0) return 0;
  if (thread > 0) atomic.add<i32>(ctrl + HELPED, done);
  if (atomic.add<i32>(ctrl + DONE, done) + done == load<i32>(ctrl + TOTAL) && atomic.load<i32>(ctrl + WAITING) != 0) atomic.notify(ctrl + DONE);
  return done;
}
