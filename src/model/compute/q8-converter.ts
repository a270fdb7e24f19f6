import assert from "node:assert";
import { availableParallelism } from "node:os";
import { controlBytes, J_CONVERT_Q8, KernelThreads, runJobs, writeRowsJob } from "./kernel-threads.ts";
import { copyBytes } from "./mapped-file.ts";
import { JOB_INTS, type KernelExports } from "./kernel-exports.ts";
import { KERNEL_RESERVED_BYTES, kernelModule } from "./matmul.ts";
import { Q8_0_BLOCK_BYTES, QK8_0 } from "./packed.ts";

/** A conversion's source dtype, as kernels/assembly/convert.ts numbers it. */
const SRC_INDEX = { f32: 0, f16: 1, bf16: 2 } as const;
export type Q8Source = keyof typeof SRC_INDEX;

/** Source bytes staged a dispatch at a time: big enough that a dispatch's handoff is lost in it. */
const STAGE_BYTES = 8 << 20;
const PAGE = 65536;

/**
 * `--dtype q8_0` of a 16-bit or f32 matrix at load, on every core: rows are read from the file
 * (copyBytes: a mapped file's pages are read, never touched) into a staging area of a small
 * kernel memory of its own, converted there by kernels/assembly/convert.ts on this thread and
 * `threads - 1` helper threads (the matmul kernels' dispatch, each taking chunks of whole rows),
 * and copied out. The bytes are quantizeQ8Row's (packed.ts) for every input, whichever thread
 * converted a row: each block depends only on its own 32 weights.
 *
 * Open one for a model's conversion and close it after: its helpers are threads.
 */
export class Q8Converter {
  private readonly ex: KernelExports;
  private readonly threads: KernelThreads | null;
  private readonly u8: Uint8Array;
  private readonly inAt: number;
  private readonly outAt: number;
  /** The one job record, in the memory (runJobs passes its address). */
  private readonly jobs: Int32Array;

  private readonly stageBytes: number;

  /**
   * A converter on `threads` threads (default: every core), or null without the wasm kernels.
   * `stageBytes`: source bytes a dispatch (tests take a few rows at a time).
   */
  static open(threads = availableParallelism(), stageBytes = STAGE_BYTES): Q8Converter | null {
    const mod = kernelModule();
    return mod === null ? null : new Q8Converter(mod, Math.max(1, threads), stageBytes);
  }

  private constructor(mod: WebAssembly.Module, threads: number, stageBytes: number) {
    this.stageBytes = stageBytes;
    const helpers = threads - 1;
    const ctrlAt = KERNEL_RESERVED_BYTES;
    const jobAt = ctrlAt + Math.ceil(controlBytes(Math.max(helpers, 1)) / 64) * 64;
    const inAt = jobAt + 64;
    const outAt = inAt + stageBytes;
    // A q8_0 block is 34 bytes for 32 weights: at most 34/64 of f16's bytes, 34/128 of f32's.
    const end = outAt + Math.ceil((stageBytes / 2 / QK8_0) * Q8_0_BLOCK_BYTES);
    const memory = new WebAssembly.Memory({ initial: Math.ceil(end / PAGE), maximum: Math.ceil(end / PAGE), shared: true });
    this.ex = new WebAssembly.Instance(mod, { env: { memory } }).exports as unknown as KernelExports;
    this.u8 = new Uint8Array(memory.buffer);
    this.jobs = new Int32Array(memory.buffer, jobAt, JOB_INTS);
    this.inAt = inAt;
    this.outAt = outAt;
    this.threads = helpers > 0 ? new KernelThreads(mod, memory, helpers, ctrlAt) : null;
  }

  /**
   * `rows` rows of `cols` weights of dtype `from` in src (row-major; a view of a mapped file is
   * read, not touched) as q8_0 blocks into out from byte outFrom.
   */
  convert(from: Q8Source, src: Uint8Array, rows: number, cols: number, out: Uint8Array, outFrom: number): void {
    assert(cols % QK8_0 === 0, `q8_0 needs rows of whole blocks of ${QK8_0}: a row has ${cols}`);
    const es = from === "f32" ? 4 : 2;
    const inRow = cols * es;
    const outRow = (cols / QK8_0) * Q8_0_BLOCK_BYTES;
    assert(src.length === rows * inRow && out.length >= outFrom + rows * outRow, "q8_0 conversion: sizes");
    const chunk = Math.max(1, Math.floor(this.stageBytes / inRow));
    assert(chunk * inRow <= this.stageBytes, `a row of ${inRow} bytes is past the conversion's staging`);
    const j = this.jobs;
    for (let r0 = 0; r0 < rows; r0 += chunk) {
      const k = Math.min(chunk, rows - r0);
      copyBytes(this.u8, this.inAt, src.subarray(r0 * inRow, (r0 + k) * inRow));
      writeRowsJob(j, J_CONVERT_Q8, this.outAt, this.inAt, SRC_INDEX[from], cols, k);
      const t = this.threads;
      if (t?.available) t.run(this.ex, j, 1, 0, 0);
      else runJobs(this.ex, j, 1, 0);
      out.set(this.u8.subarray(this.outAt, this.outAt + k * outRow), outFrom + r0 * outRow);
    }
  }

  /** Settles when every helper thread runs (conversions never wait for it). */
  get ready(): Promise<void> {
    return this.threads?.ready ?? Promise.resolve();
  }

  /** Chunks the helper threads converted so far (tests check they take part). */
  get helperChunks(): number {
    return this.threads?.helperChunks ?? 0;
  }

  close(): void {
    this.threads?.close();
  }
}
