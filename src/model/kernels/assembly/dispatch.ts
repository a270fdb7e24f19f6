// One dispatch of matmuls, or of attention, shared by every thread (built with matmul.ts into one
// module).
//
// The caller writes the dispatch into a control block in the shared memory: first NEXT =
// gen << 16 | 0xffff (claims closed: a thread still in the last dispatch fails its swap), then the
// jobs (a matmul each), every job cut into chunks of whole 8-row strips, then NEXT = gen << 16.
// Each thread (the caller too) then claims chunks one at a time with compare-and-swap, computes
// each whole, and counts it in DONE; the dispatch is over when DONE reaches TOTAL. A thread that
// is slow or descheduled only delays the chunk it holds: the others take the rest. A claim checks
// the generation, so a thread still looking at an old dispatch can never take a chunk of a new
// one. Which thread computes a chunk never changes a bit of it (kernels/assembly/matmul.ts). An
// attention job (fn ATTEND, its parameters at w) is cut into one chunk per sequence and KV head,
// each computed whole (kernels/assembly/attention.ts).

import { attend_jobs } from "./attention";
import { matmul_bf16, matmul_f16, matmul_f32 } from "./matmul";
import { matmul_q8_0 } from "./q8";

// Control block, in i32 slots (MatmulKernel's kernel-threads.ts writes the same layout).
const NEXT: usize = 16 << 2;
const DONE: usize = 32 << 2;
const TOTAL: usize = 48 << 2;
const COUNT: usize = 49 << 2;
const SCRATCH: usize = 50 << 2;
const STRIDE: usize = 51 << 2;
const WAITING: usize = 52 << 2;
const HELPED: usize = 53 << 2;
const JOBS: usize = 64 << 2;
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
  else matmul_q8_0(y, x, w, rows, n, d, r0, g0, g1, scratch);
}

/**
 * Claims and computes chunks of dispatch `gen` until none are left; `thread` picks the scratch.
 * Returns the chunks this thread computed.
 */
export function run_chunks(ctrl: usize, thread: i32, gen: i32): i32 {
  const scratch = <usize>atomic.load<i32>(ctrl + SCRATCH) + <usize>(thread * atomic.load<i32>(ctrl + STRIDE));
  let done = 0;
  for (;;) {
    const v = atomic.load<i32>(ctrl + NEXT);
    if ((v >>> 16) != (gen & 0x7fff)) break;
    const c = v & 0xffff;
    const total = atomic.load<i32>(ctrl + TOTAL);
    if (c >= total) break;
    if (atomic.cmpxchg<i32>(ctrl + NEXT, v, v + 1) != v) continue;
    const count = atomic.load<i32>(ctrl + COUNT);
    let job = ctrl + JOBS;
    for (let j = 1; j < count && load<i32>(job + JOB_BYTES, 36) <= c; j++) job += JOB_BYTES;
    runChunk(job, c, load<i32>(job, 36), scratch);
    done++;
    if (atomic.add<i32>(ctrl + DONE, 1) + 1 == total && atomic.load<i32>(ctrl + WAITING) != 0) atomic.notify(ctrl + DONE);
  }
  if (thread > 0 && done > 0) atomic.add<i32>(ctrl + HELPED, done);
  return done;
}
