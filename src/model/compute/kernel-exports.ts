import type { DType } from "./packed.ts";

/**
 * The i32 slots of the attention kernel's AttendJob record (kernels/assembly/attention.ts), which
 * `attend` takes one pointer to and attend_jobs fills at the start of each thread's scratch:
 * byte addresses (out, q, table, att, lin), layerOff in bytes, the rest counts.
 */
export const ATTEND_JOB = {
  out: 0,
  q: 1,
  table: 2,
  layerOff: 3,
  att: 4,
  attStride: 5,
  lin: 6,
  firstPos: 7,
  nr: 8,
  B: 9,
  nKv: 10,
  kvMul: 11,
  hd: 12,
  qStride: 13,
} as const;
/** Bytes attend_jobs keeps for its AttendJob before the scores in its scratch (ATTEND_JOB_BYTES there). */
export const ATTEND_JOB_BYTES = 64;

/**
 * The i32 slots of a job record (kernels/assembly/job.ts' Job), which every matmul kernel takes
 * one pointer to: the kernel (KERNEL_INDEX in kernel-threads.ts, J_ATTEND, J_CONVERT_Q8), byte
 * addresses (y, x, w), then counts (rows, n, d) and r0, the matrix row whose outputs go to y's
 * column 0. A queued job is JOB_INTS slots; KernelThreads' copy in its control block adds J_PER
 * (rows per chunk) and J_FIRST (the job's first chunk), which dispatch.ts reads.
 */
export const J_FN = 0;
export const J_Y = 1;
export const J_X = 2;
export const J_W = 3;
export const J_ROWS = 4;
export const J_N = 5;
export const J_D = 6;
export const J_R0 = 7;
export const JOB_INTS = 8;
export const J_PER = 8;
export const J_FIRST = 9;

/**
 * The exports of the kernel module besides the matmuls (kernels/assembly/attention.ts and
 * elementwise.ts state their orders). Every argument that names memory is a byte offset into the
 * kernel's memory.
 */
interface LayerKernelExports {
  /** Every head of one sequence, the AttendJob record at `job` (ATTEND_JOB's slots). */
  attend(job: number): void;
  /** Pieces c0 .. c1 of the attention dispatch at params (Transformer writes its layout). */
  attend_jobs(params: number, c0: number, c1: number, scratch: number): void;
  swiglu(h: number, g: number, n: number): void;
  add_into(x: number, y: number, n: number): void;
  to_f16(dst: number, src: number, n: number): void;
  rmsnorm(o: number, x: number, g: number, rows: number, dim: number, eps: number): void;
  rope(q: number, k: number, pos: number, cos: number, sin: number, rows: number, qDim: number, kvDim: number, hd: number): void;
  store_kv(dst: number, layerOff: number, vOff: number, k: number, v: number, rows: number, kvDim: number): void;
}

/**
 * One matmul kernel on the job record at `job` (J_Y .. J_R0, in kernel memory): y[r*d + (g - r0)] =
 * dot(W row g, x row r) for r < rows, g0 <= g < g1 (kernels/assembly/matmul.ts).
 */
type KernelFn = (job: number, g0: number, g1: number, scratch: number) => void;
/** The kernel module's exports, as MatmulKernel instantiates it and its helper threads run it (kernel-threads.ts). */
export type KernelExports = Record<`matmul_${DType}`, KernelFn> &
  LayerKernelExports & {
    /** matmul_f16 on weights placed in the shifted coding (F16_SHIFTED: f16-bits.ts' f16Shift). */
    matmul_f16s: KernelFn;
    /** Claims and computes chunks of the open dispatch (kernels/assembly/dispatch.ts). */
    run_chunks(ctrl: number, thread: number): number;
    /**
     * The whole matmul job at `job` on this thread in token tiles of at most `budget` bytes of x
     * (dispatch.ts), its rows in blocks of `per`, each tile's job record written at `tj`.
     */
    matmul_tiled(job: number, scratch: number, tj: number, budget: number, per: number): void;
    /** A one-token matmul job whole on this thread, as a dispatch's chunks of `per` rows walk it (dispatch.ts' THE STREAMS). */
    matmul_one_token(job: number, per: number, scratch: number): void;
    /** rows token rows of n f32 at x quantized for the q8_0 kernel at dst (q8_row_bytes(n) each, in quads: q8.ts). */
    quantize_q8_x(dst: number, x: number, rows: number, n: number): void;
    q8_row_bytes(n: number): number;
    /** rows token rows of n f32 at x quantized for the q4_k and q6_k kernels at dst (k_row_bytes(n) each). */
    quantize_k_x(dst: number, x: number, rows: number, n: number): void;
    k_row_bytes(n: number): number;
    /** rows token rows of n f32 at x quantized for the legacy kernels at dst (l_row_bytes(n) each). */
    quantize_l_x(dst: number, x: number, rows: number, n: number): void;
    l_row_bytes(n: number): number;
    /** Rows g0 .. g1 of n weights at x (0 f32, 1 f16, 2 bf16) to q8_0 blocks at y (kernels/assembly/convert.ts). */
    convert_q8_rows(y: number, x: number, src: number, n: number, g0: number, g1: number): void;
    /**
     * Rows g0 .. g1 (g0 a multiple of 8) of `rows` rows of n weights of dtype dt (KERNEL_INDEX;
     * 16-bit or ggml blocks) at src into their strips at dst (kernels/assembly/place-strips.ts).
     */
    place_rows(dst: number, src: number, dt: number, n: number, rows: number, g0: number, g1: number): void;
    /** Bytes from one token row of kernel fn's x to the next (n f32, or its quantized layout's row). */
    x_row_bytes(fn: number, n: number): number;
    /** Token rows r0 .. r1 of `rows` rows of n f32 at x quantized at dst (row 0's place) in layout 1 (q8_0), 2 (K) or 3 (legacy). */
    quantize_rows(dst: number, x: number, layout: number, n: number, r0: number, r1: number, rows: number): void;
    /** Bytes from .. to written to once a 4 KiB page without a change, 64 KiB spans s0 .. s1 of them (dispatch.ts). */
    touch_pages(from: number, to: number, s0: number, s1: number): void;
    /** 1 when place_rows places dtype dt (KERNEL_INDEX), else 0. */
    places(dt: number): number;
    /**
     * The first of `count` blocks of dt at src with an inf or NaN f16 scale (f16: weights;
     * F16_SHIFTED: the first weight the shifted coding cannot hold, |w| >= 128), else -1.
     */
    first_bad(src: number, dt: number, count: number): number;
  };
