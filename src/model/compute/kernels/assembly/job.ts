// A job record: one matmul, conversion or attention dispatch, as llama2.c passes Config*: i32
// slots in kernel memory read through one pointer. MatmulKernel queues these (kernel-threads.ts'
// runJobs passes a queued record's address), KernelThreads copies them into its control block
// with per and first added (dispatch.ts' runChunk passes that copy's); J_FN .. J_FIRST in
// kernel-exports.ts name the same slots for TypeScript.

/** Slot order: fn, y, x, w, rows, n, d, r0, per, first (4 bytes each). */
@unmanaged export class Job {
  /** The kernel (kernel-threads.ts' KERNEL_INDEX, J_ATTEND, J_CONVERT_Q8). */
  fn: i32;
  /** Byte addresses: the output rows, the token rows (quantized for the integer kernels), the matrix. */
  y: usize;
  x: usize;
  w: usize;
  /** Token rows, their length, the outputs per token row (y's row stride). */
  rows: i32;
  n: i32;
  d: i32;
  /** The matrix row whose outputs go to y's column 0. */
  r0: i32;
  /** The dispatch's copy only: rows per chunk, and the job's first chunk. */
  per: i32;
  first: i32;
}
