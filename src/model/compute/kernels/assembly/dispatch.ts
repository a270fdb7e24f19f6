// One dispatch of matmuls, or of attention, shared by every thread (built with matmul.ts into one
// module).
//
// The caller writes the dispatch into a control block in the shared memory. Its jobs (a matmul
// each) are cut into chunks of whole 8-row strips, numbered across the jobs in order, and the
// chunks into one contiguous range per thread, each range a word of its own cache line:
// front << 16 | back. A thread takes chunks from the front of its own range, so it streams
// through its rows in order and its claims stay in its own cache; when its range is empty it
// steals from the back of the others', one chunk at a time, so a thread that is late,
// descheduled or never started only leaves its range to the rest. Every claim is a
// compare-and-swap of a range word; each chunk is computed whole and counted in DONE (by each
// thread once it finds no chunk left), and the dispatch is over when DONE reaches TOTAL. Which thread computes a chunk never changes a bit of
// it (kernels/assembly/matmul.ts). An attention job (fn ATTEND, its parameters at w) is cut into
// one chunk per piece (a sequence's KV heads), each computed whole (kernels/assembly/attention.ts).
//
// The caller closes every range (front = back) before writing a new dispatch and opens them
// after, so a thread still looking for chunks of the last dispatch either finds none or claims a
// chunk of the new one, fully written by then (seq-cst atomics order the plain stores before
// the opening): it reads the job, the scratch and the counters only after its claim.

import { attend_jobs } from "./attention";
import { matmul_bf16, matmul_f16, matmul_f32 } from "./matmul";
import { matmul_q4_k, matmul_q5_k, matmul_q6_k } from "./kquants";
import { matmul_q4_0, matmul_q4_1, matmul_q5_0, matmul_q5_1 } from "./legacy";
import { matmul_q8_0 } from "./q8";

// Control block, in i32 slots (kernel-threads.ts writes the same layout).
const DONE: usize = 16 << 2;
const TOTAL: usize = 32 << 2;
const COUNT: usize = 33 << 2;
const SCRATCH: usize = 34 << 2;
const STRIDE: usize = 35 << 2;
const WAITING: usize = 36 << 2;
const HELPED: usize = 37 << 2;
const THREADS: usize = 39 << 2;
const JOBS: usize = 48 << 2;
/** Thread t's range word at RANGES + t * RANGE_BYTES (a cache line each). */
const RANGES: usize = 128 << 2;
const RANGE_BYTES: usize = 64;
/** A job: fn, y, x, w, rows, n, d, r0, chunk rows, first chunk. */
const JOB_BYTES: usize = 10 << 2;
const ATTEND: i32 = 4;

/** Computes chunk c (of job j, whose chunks start at `first`) on this thread. */
@inline function runChunk(job: usize, c: i32, first: i32, scratch: usize): void {
  const fn = load<i32>(job);
  if (fn == ATTEND) {
    attend_jobs(<usize>load<i32>(job, 12), c - first, c - first + 1, scratch);
    return;
  }
  const r0 = load<i32>(job, 28);
  const end = r0 + load<i32>(job, 24);
  const per = load<i32>(job, 32);
  const base = r0 & ~7;
  const g0 = max(r0, base + (c - first) * per);
  const g1 = min(end, base + (c - first + 1) * per);
  const y = <usize>load<i32>(job, 4);
  const x = <usize>load<i32>(job, 8);
  const w = <usize>load<i32>(job, 12);
  const rows = load<i32>(job, 16);
  const n = load<i32>(job, 20);
  const d = load<i32>(job, 24);
  if (fn == 0) matmul_f32(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 1) matmul_f16(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 2) matmul_bf16(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 3) matmul_q8_0(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 5) matmul_q4_k(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 6) matmul_q6_k(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 7) matmul_q4_0(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 8) matmul_q4_1(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 9) matmul_q5_0(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else if (fn == 10) matmul_q5_1(y, x, w, rows, n, d, r0, g0, g1, scratch);
  else matmul_q5_k(y, x, w, rows, n, d, r0, g0, g1, scratch);
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
  for (;;) {
    const c = claim(ctrl, thread);
    if (c < 0) break;
    // Read after the claim: the dispatch the chunk belongs to is the one written before its range opened.
    const scratch = <usize>load<i32>(ctrl + SCRATCH) + <usize>(thread * load<i32>(ctrl + STRIDE));
    const count = load<i32>(ctrl + COUNT);
    let job = ctrl + JOBS;
    for (let j = 1; j < count && load<i32>(job + JOB_BYTES, 36) <= c; j++) job += JOB_BYTES;
    runChunk(job, c, load<i32>(job, 36), scratch);
    done++;
  }
  if (done == 0) return 0;
  if (thread > 0) atomic.add<i32>(ctrl + HELPED, done);
  if (atomic.add<i32>(ctrl + DONE, done) + done == load<i32>(ctrl + TOTAL) && atomic.load<i32>(ctrl + WAITING) != 0) atomic.notify(ctrl + DONE);
  return done;
}
