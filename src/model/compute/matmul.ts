import assert from "node:assert";
import { KERNELS_WASM_BASE64 } from "./kernels/kernels-wasm.ts";
import {
  controlBytes,
  F16_SHIFTED,
  J_ATTEND,
  J_PLACE,
  J_QUANT_X,
  J_SWIGLU,
  KERNEL_INDEX,
  KernelThreads,
  runJobs,
  TILE_JOB_BYTES,
  Tiles,
  writeRowsJob,
  writeTouchJob,
} from "./kernel-threads.ts";
import { J_D, J_FN, J_N, J_R0, J_ROWS, J_W, J_X, J_Y, JOB_INTS, type KernelExports } from "./kernel-exports.ts";
import { matmulQ4KRef, matmulQ6KRef } from "./k-quant-ref.ts";
import { isK } from "./k-quants.ts";
import { isLegacy, legacyD, legacyM, legacyQ, legacyShape } from "./legacy-quants.ts";
import {
  assertFinite16,
  blockElems,
  dequantizeInto,
  type DType,
  dtypeOf,
  f16Values,
  isStacked,
  type Matrix,
  type PackedMatrix,
  partIndex,
  partStart,
  Q8_0_BLOCK_BYTES,
  QK8_0,
  type SimpleMatrix,
  type StackedMatrix,
} from "./packed.ts";
import { adviseHugePages } from "./huge-pages.ts";
import { copyBytes } from "./mapped-file.ts";
import { type MemoryViews, packStrips, readStripRow, STRIP_ROWS, stripBytes, stripLayoutBytes } from "./strip-layout.ts";
import { quantizeXRef, xRef } from "./x-quant-ref.ts";

/**
 * y[r*d + i] = dot(w[wOff + i*n .. + n), x[r*n .. + n))  for r < rows, i < d, every dot summed
 * in one fixed order (see kernels/assembly/matmul.ts): four f32 lanes over j = l (mod 4), folded
 * as (s0 + s1) + (s2 + s3), then the n % 4 tail in order. This is the plain JS statement of that
 * order: the bit-for-bit reference for the f32, f16 and bf16 kernels (a 16-bit w is first made
 * f32, which is exact), and their fallback; a q8_0 w goes to matmulQ8Ref, q4_k and q6_k to
 * matmulQ4KRef and matmulQ6KRef (k-quant-ref.ts), their kernels' own orders. JS forbids fused multiply-add, and Math.fround after every product and sum gives f32
 * arithmetic exactly.
 */
export function matmulRef(y: Float32Array, x: Float32Array, wm: Matrix, wmOff: number, rows: number, n: number, d: number): void {
  let w: SimpleMatrix = wm as SimpleMatrix;
  let wOff = wmOff;
  if (isStacked(wm)) {
    const i = partIndex(wm, wmOff, n * d);
    w = wm.parts[i]!;
    wOff = wmOff - partStart(wm, i);
  }
  if (!(w instanceof Float32Array) && w.dtype === "q8_0") {
    matmulQ8Ref(y, x, w, wOff, rows, n, d);
    return;
  }
  if (!(w instanceof Float32Array) && isLegacy(w.dtype)) {
    matmulLegacyRef(y, x, w, wOff, rows, n, d);
    return;
  }
  if (!(w instanceof Float32Array) && (w.dtype === "q4_k" || w.dtype === "q5_k" || w.dtype === "q6_k")) {
    (w.dtype === "q6_k" ? matmulQ6KRef : matmulQ4KRef)(y, x, w, wOff, rows, n, d);
    return;
  }
  if (!(w instanceof Float32Array)) {
    // The fallback's only allocation: engines without WebAssembly SIMD, and the tests' oracle.
    const f = new Float32Array(n * d);
    dequantizeInto(w, wOff, n * d, f);
    w = f;
    wOff = 0;
  }
  const f = Math.fround;
  const n4 = n - (n % 4);
  for (let r = 0; r < rows; r++) {
    const xa = r * n;
    for (let i = 0; i < d; i++) {
      const wa = wOff + i * n;
      let s0 = 0,
        s1 = 0,
        s2 = 0,
        s3 = 0;
      for (let j = 0; j < n4; j += 4) {
        s0 = f(s0 + f(w[wa + j]! * x[xa + j]!));
        s1 = f(s1 + f(w[wa + j + 1]! * x[xa + j + 1]!));
        s2 = f(s2 + f(w[wa + j + 2]! * x[xa + j + 2]!));
        s3 = f(s3 + f(w[wa + j + 3]! * x[xa + j + 3]!));
      }
      let s = f(f(s0 + s1) + f(s2 + s3));
      for (let j = n4; j < n; j++) s = f(s + f(w[wa + j]! * x[xa + j]!));
      y[r * d + i] = s;
    }
  }
}

/**
 * The q8_0 kernel's order in plain JS (see THE Q8 ORDER in kernels/assembly/q8.ts): x quantized
 * per 32-block (quantizeXRef), then per output one running f32 sum over the blocks in order of
 * f32(integer dot) * (weight scale * x scale). w is read in its ggml blocks, nothing inflated.
 */
export function matmulQ8Ref(y: Float32Array, x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): void {
  const f = Math.fround;
  const f16 = f16Values();
  const b = w.bytes;
  const q8 = new Int8Array(b.buffer, b.byteOffset, b.byteLength);
  const blocks = n / QK8_0;
  for (let r = 0; r < rows; r++) {
    quantizeXRef(x, r * n, n, QK8_0, -32768, 32767);
    const { q: refQ, scales: refScales } = xRef;
    for (let i = 0; i < d; i++) {
      const first = (wOff + i * n) / QK8_0;
      let s = 0;
      for (let k = 0; k < blocks; k++) {
        const at = (first + k) * Q8_0_BLOCK_BYTES;
        let dot = 0;
        for (let j = 0; j < QK8_0; j++) dot += q8[at + 2 + j]! * refQ[k * QK8_0 + j]!;
        s = f(s + f(f(dot) * f(f16[b[at]! | (b[at + 1]! << 8)]! * refScales[k]!)));
      }
      y[r * d + i] = s;
    }
  }
}

/**
 * The legacy kernels' order in plain JS (THE LEGACY ORDER in kernels/assembly/legacy.ts), on
 * ggml's blocks: x quantized per 32-block into [-127, 127] (quantizeXRef, as kquants.ts's
 * quads: the relaxed dot takes i8), then per output one running f32 sum over
 * the blocks of f32(I) * (d * s) (+ f32(X) * (m * s) for q4_1 and q5_1), I = sum u q + offset * X.
 */
export function matmulLegacyRef(y: Float32Array, x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): void {
  if (!isLegacy(w.dtype)) assert.fail(`matmulLegacyRef on ${w.dtype}`);
  const dt = w.dtype;
  const { bytes, min, offset } = legacyShape(dt);
  const f = Math.fround;
  const f16 = f16Values();
  const b = w.bytes;
  const blocks = n / QK8_0;
  for (let r = 0; r < rows; r++) {
    quantizeXRef(x, r * n, n, QK8_0, -127, 127);
    const { q: refQ, scales: refScales } = xRef;
    for (let i = 0; i < d; i++) {
      const first = (wOff + i * n) / QK8_0;
      let acc = 0;
      for (let k = 0; k < blocks; k++) {
        const at = (first + k) * bytes;
        let dot = 0;
        let sum = 0;
        for (let j = 0; j < QK8_0; j++) {
          dot += legacyQ(dt, b, at, j) * refQ[k * QK8_0 + j]!;
          sum += refQ[k * QK8_0 + j]!;
        }
        const s = refScales[k]!;
        let t = f(f(dot + offset * sum) * f(f16[legacyD(b, at)]! * s));
        if (min) t = f(t + f(f(sum) * f(f16[legacyM(b, at)]! * s)));
        acc = f(acc + t);
      }
      y[r * d + i] = acc;
    }
  }
}

const PAGE = 65536;
/** wasm32 addresses 4 GiB; weights past this (less room for activations) run matmulRef. */
const MAX_PAGES = 65536;
export const MAX_PLACED_BYTES = 2 ** 32 - 2 ** 28;
/**
 * Bytes at the start of the memory left to the kernels' static data (AssemblyScript's expf
 * table): every instantiation, each helper thread's too, writes its data segments there.
 */
export const KERNEL_RESERVED_BYTES = 65536;
/** Multiply-adds below which a dispatch stays on the calling thread: waking helpers costs more. */
const SPLIT_MACS = 1 << 16;
/** Token rows from which quantizing a dispatch's x is split over the threads (a prefill's, not a decode batch's). */
const QUANT_SPLIT_ROWS = 32;
/**
 * Floats from which SwiGLU is split over the threads, in spans of SWIGLU_SPAN: a decode batch's
 * (8 rows of an 8B's 14336: 0.17 ms a layer on one thread, Intel Xeon), not one token's.
 */
const SWIGLU_SPLIT = 1 << 15;
const SWIGLU_SPAN = 512;
/** Matmuls one dispatch carries (queue flushes itself when full). */
export const MAX_JOBS = 4;

export interface KernelOptions {
  /** Threads a large matmul's output rows are split over, the caller included (default 1). */
  threads?: number;
  /** false: the plain-JS fallback even where SIMD runs (tests hold the two paths together). */
  simd?: boolean;
  /**
   * Bytes left unused below the first placement (never written, so they cost no resident memory).
   * Tests place every tensor past 2 GiB with it, where a byte offset read as a signed 32-bit
   * number goes wrong; 0 in service.
   */
  gapBytes?: number;
  /**
   * Bytes of x a token tile of a matmul reads at most (kernel-threads.ts' TILE_X_BYTES by
   * default; 0: no tiles). Tests shrink it so small matmuls run in many tiles.
   */
  tileXBytes?: number;
  /** Told the bytes of each matrix as it is placed (Transformer's progress line). */
  placing?: { add(bytes: number): void };
  /** Bytes of a matrix's rows staged a dispatch at a time (PLACE_STAGE_BYTES; tests take a few rows). */
  placeStageBytes?: number;
  /**
   * true: every matrix packed by the plain-JS packers on the calling thread (strip-layout.ts),
   * as K-quant and legacy ones were before the kernels placed them: bench/load-quant.ts'
   * baseline, the same bytes.
   */
  placeJs?: boolean;
  /** How long a helper thread spins after a dispatch before sleeping (kernel-threads.ts' HELPER_SPIN_MS; tests lengthen it). */
  helperSpinMs?: number;
  /** false: the memory is not advised for 2 MiB pages (huge-pages.ts; benches compare the two). */
  hugePages?: boolean;
}

/**
 * Bytes of a matrix's rows read from the file at a time, to be placed from there by every
 * thread: enough that a dispatch's handoff is lost in it, few enough to stay in the caches' reach.
 */
const PLACE_STAGE_BYTES = 4 << 20;

/** A weight matrix to place, with the length of its rows. */
export interface Placement {
  matrix: Matrix;
  cols: number;
}

let compiled: WebAssembly.Module | null | undefined;

/** The kernel module, compiled once per process; null where the engine lacks WebAssembly SIMD or threads. */
export function kernelModule(): WebAssembly.Module | null {
  if (compiled === undefined) {
    const bytes = Uint8Array.from(atob(KERNELS_WASM_BASE64), (c) => c.charCodeAt(0));
    compiled = null;
    if (typeof WebAssembly === "object" && typeof SharedArrayBuffer === "function" && WebAssembly.validate(bytes)) {
      compiled = new WebAssembly.Module(bytes);
    }
  }
  return compiled;
}

/** A shared memory of `pages`, or null when the engine will not map it. */
function sharedMemory(pages: number): WebAssembly.Memory | null {
  try {
    return new WebAssembly.Memory({ initial: Math.max(1, pages), maximum: MAX_PAGES, shared: true });
  } catch (e) {
    if (e instanceof RangeError) return null;
    throw e;
  }
}

/** Where a placed matrix lives: its strips at `at`, rows of `cols`. */
interface Placed {
  at: number;
  cols: number;
  /** The kernel its strips are for: KERNEL_INDEX of its dtype, or F16_SHIFTED. */
  fn: number;
}

/**
 * Matmuls over one shared WebAssembly memory. The matrices given to the constructor are copied
 * into it once, in their own dtype and the kernels' strip layout (strip-layout.ts), and used from
 * there through `views` (the kernel keeps no reference to the originals, so a caller that drops
 * them holds each weight once; a bare f32 matrix, whose row length is not known yet, is placed
 * at its first call and kept); any other w has the rows it needs packed in per call (tests,
 * micro-benchmarks). Activations allocated with
 * `alloc` live in the memory too and go to the kernel in place; other x and y are copied in and
 * out per call. Without WebAssembly SIMD, or for weights past wasm32's reach, every call runs
 * matmulRef, which gives the same bits.
 *
 * Matmuls are dispatched in groups: `queue` several that do not feed each other, then `flush`
 * runs them in one handoff to the helper threads (each thread takes its share of every one).
 * `matmul` is queue-and-flush of one.
 */
export class MatmulKernel {
  readonly memory: WebAssembly.Memory | null;
  /**
   * What runs the matmuls: "wasm-simd", or "plain-js (why)" on the fallback, which gives the same
   * bits on one core at a small fraction of the speed: the ready line says it, never silently.
   */
  readonly kernels: string = "wasm-simd";
  /** Whether the kernel memory is advised for 2 MiB pages and the host hands them out (huge-pages.ts' THE HUGE PAGES). */
  readonly hugePages: boolean = false;
  private readonly ex: KernelExports | null;
  private f32 = new Float32Array(0);
  private u8 = new Uint8Array(0);
  /** The memory as f32, u16 and i8, for reading placed rows. */
  private views16: MemoryViews = { f32: this.f32, u8: this.u8, u16: new Uint16Array(0), i8: new Int8Array(0) };
  /** Placed matrices by their views (never the originals, so those can be collected). */
  private readonly placed = new Map<Matrix, Placed>();
  /** The same by the originals, weakly: a caller that kept one may call with it too. */
  private readonly byOriginal = new WeakMap<Matrix, Placed>();
  /**
   * The constructor's tensors, index for index: views on their copies in the memory, which hold
   * the strip layout (so read their rows with `rowInto`, never their elements), or on the
   * fallback the tensors themselves. Call matmul with these: the originals are not kept.
   */
  readonly views: readonly Matrix[];
  /** Each stacked matrix given to the constructor, to its view (whose parts are placed). */
  private readonly stackViews = new WeakMap<StackedMatrix, StackedMatrix>();
  /** Bare f32 matrices to place at their first call, when their row length is known. */
  private readonly unplaced = new Set<Float32Array>();
  /** Every SharedArrayBuffer object the memory has shown (one per size): views on any are ours. */
  private readonly buffers = new Set<ArrayBufferLike>();
  /** Byte offset where unallocated space (per-call copies) starts. */
  private top = KERNEL_RESERVED_BYTES;
  private threads: KernelThreads | null = null;
  /** The token tiles' settings, shared with the helper threads (bench/prefill-tiles.ts switches them). */
  readonly tiles = new Tiles();
  /** The job record a matmul on this thread alone writes its tiles to (runJobs). */
  private tileJobAt = 0;
  private readonly placing: { add(bytes: number): void } | null = null;
  private readonly placeStage: number = PLACE_STAGE_BYTES;
  private readonly placeJs: boolean = false;

  // The queued jobs: JOB_INTS ints each, in the memory (the kernels take a job's address).
  private readonly jobs: Int32Array;
  /** The record of a rows job split over the threads (quantizeRows, swiglu), beside the jobs. */
  private readonly rowsJob: Int32Array;
  private queued = 0;
  private queuedMacs = 0;
  private maxCols = 0;
  /** End of this dispatch's per-call copies, above `top`. */
  private tempTop = 0;
  /** The highest tempTop ever: above it and above `top` no byte was ever written. */
  private dirtyTop = 0;
  /** Outputs to copy back after the dispatch (null: the kernel wrote them in place). */
  private readonly outs: (Float32Array | null)[] = new Array(MAX_JOBS).fill(null);
  private readonly inputs: (Float32Array | null)[] = new Array(MAX_JOBS).fill(null);
  /** Each queued q8_0 job's f32 x, once its J_X points at the quantized copy. */
  private readonly q8From = new Int32Array(MAX_JOBS);

  constructor(tensors: readonly (Matrix | Placement)[] = [], opts: KernelOptions = {}) {
    const mod = opts.simd === false ? null : kernelModule();
    const matrices = tensors.map((t) => ("matrix" in t ? t.matrix : t));
    // A stacked matrix's parts are placed each in its own dtype; its view stacks their views.
    const cols = new Map<SimpleMatrix, number>();
    tensors.forEach((t, i) => {
      const m = matrices[i]!;
      const c = "matrix" in t ? t.cols : m instanceof Float32Array ? 0 : m.cols;
      for (const p of isStacked(m) ? m.parts : [m]) if (!cols.has(p) || cols.get(p) === 0) cols.set(p, c);
    });
    let bytes = 0;
    for (const [m, c] of cols) bytes += c > 0 ? align16(stripLayoutBytes(dtypeOf(m), Math.ceil(m.length / c), c)) : 0;
    const gap = align16(opts.gapBytes ?? 0);
    const fits = gap + bytes <= MAX_PLACED_BYTES;
    const mem = mod !== null && fits ? sharedMemory(Math.ceil((KERNEL_RESERVED_BYTES + gap + bytes) / PAGE)) : null;
    if (mod === null || mem === null) {
      this.kernels =
        opts.simd === false
          ? "plain-js (asked for)"
          : mod === null
            ? "plain-js (this runtime lacks WebAssembly SIMD or shared memory)"
            : !fits
              ? `plain-js (weights of ${gib(gap + bytes)} exceed the kernel memory's ${gib(MAX_PLACED_BYTES)})`
              : `plain-js (a shared memory of ${gib(gap + bytes)} was refused)`;
      for (const m of cols.keys()) if (!(m instanceof Float32Array)) assertFinite16(m);
      this.memory = null;
      this.ex = null;
      this.jobs = new Int32Array(0);
      this.rowsJob = this.jobs;
      this.views = matrices;
      return;
    }
    this.memory = mem;
    // Before the first write: a page the memory already has stays 4 KiB.
    this.hugePages = opts.hugePages !== false && adviseHugePages(mem, MAX_PAGES * PAGE);
    this.ex = new WebAssembly.Instance(mod, { env: { memory: mem } }).exports as unknown as KernelExports;
    this.top += gap;
    this.refresh();
    const jobsAt = this.grab((MAX_JOBS + 1) * JOB_INTS * 4 + TILE_JOB_BYTES);
    this.jobs = new Int32Array(mem.buffer, jobsAt, MAX_JOBS * JOB_INTS);
    this.rowsJob = new Int32Array(mem.buffer, jobsAt + MAX_JOBS * JOB_INTS * 4, JOB_INTS);
    this.tileJobAt = jobsAt + (MAX_JOBS + 1) * JOB_INTS * 4;
    const threads = opts.threads ?? 1;
    if (!(Number.isInteger(threads) && threads >= 1)) throw new Error(`threads ${threads}: want a positive integer`);
    if (opts.tileXBytes !== undefined) {
      if (!(Number.isInteger(opts.tileXBytes) && opts.tileXBytes >= 0 && opts.tileXBytes < 2 ** 31))
        throw new Error(`tileXBytes ${opts.tileXBytes}: want a byte count`);
      this.tiles.on = opts.tileXBytes > 0;
      this.tiles.xBytes = opts.tileXBytes;
    }
    // The helpers start first: they place the matrices with the caller (placeStaged).
    if (threads > 1) {
      const ctrl = this.grab(controlBytes(threads - 1) + 48);
      this.threads = new KernelThreads(mod, mem, threads - 1, Math.ceil(ctrl / 64) * 64, this.tiles, opts.helperSpinMs);
    }
    this.placing = opts.placing ?? null;
    this.placeStage = opts.placeStageBytes ?? PLACE_STAGE_BYTES;
    this.placeJs = opts.placeJs === true;
    const viewOf = new Map<SimpleMatrix, SimpleMatrix>();
    try {
      for (const [m, c] of cols) {
        if (c > 0) {
          const v = this.place(m, c);
          viewOf.set(m, v);
          this.byOriginal.set(m, this.placed.get(v)!);
        } else this.unplaced.add(m as Float32Array);
      }
    } catch (e) {
      this.close();
      throw e;
    }
    this.views = matrices.map((m) => {
      if (!isStacked(m)) return viewOf.get(m) ?? m;
      const v: StackedMatrix = { ...m, parts: m.parts.map((p) => viewOf.get(p) ?? p) };
      this.stackViews.set(m, v);
      return v;
    });
  }

  /** Bytes of the memory taken for good (weights, activations, room given out): where the next allocation goes. */
  get usedBytes(): number {
    return this.top;
  }

  /** Threads that run large matmuls (1 on the fallback). */
  get threadCount(): number {
    return this.threads === null ? 1 : this.threads.helpers + 1;
  }

  /** Chunks of matmuls that helper threads computed (tests check the threads work). */
  get splitCalls(): number {
    return this.threads?.helperChunks ?? 0;
  }

  /** Settles when every helper thread runs (until then the caller does their share). */
  ready(): Promise<void> {
    return this.threads?.ready ?? Promise.resolve();
  }

  /** Helper threads asleep now (tests see rest() work). */
  get sleepingHelpers(): number {
    return this.threads?.sleepingHelpers ?? 0;
  }

  /** Sends the helper threads to sleep until the next dispatch (KernelThreads.rest): the caller moves to another memory's kernels. */
  rest(): void {
    this.threads?.rest();
  }

  /** Stops the helper threads; later calls run on the caller alone. */
  close(): void {
    this.threads?.close();
    this.threads = null;
  }

  /** True when the SIMD kernels run; false on the matmulRef fallback. */
  get simd(): boolean {
    return this.ex !== null;
  }

  /** Byte offset of a placed matrix's strips (for threads that share the memory), or -1. */
  offsetOf(w: Matrix): number {
    return isStacked(w) ? -1 : (this.find(w)?.at ?? -1);
  }

  /** A zeroed f32 array living in the memory (a plain array on the fallback); freed only by release. */
  alloc(floats: number): Float32Array {
    return this.allocZeroedOf(Float32Array, floats);
  }

  /** A zeroed i32 array living in the memory (a plain array on the fallback); freed only by release. */
  allocInts(ints: number): Int32Array {
    return this.allocZeroedOf(Int32Array, ints);
  }

  /** A zeroed f64 array living in the memory (a plain array on the fallback); freed only by release. */
  allocF64(n: number): Float64Array {
    return this.allocZeroedOf(Float64Array, n);
  }

  private allocZeroedOf<T extends Float32Array | Int32Array | Float64Array>(
    Ctor: { new (n: number): T; new (b: ArrayBufferLike, at: number, n: number): T; BYTES_PER_ELEMENT: number },
    n: number,
  ): T {
    if (this.ex === null) return new Ctor(n);
    // grab first: it may grow the memory, which replaces its buffer.
    const at = this.grab(n * Ctor.BYTES_PER_ELEMENT);
    const a = new Ctor(this.memory!.buffer, at, n);
    a.fill(0);
    return a;
  }

  /**
   * Zeroed bytes living in the memory (null on the fallback); freed only by release. Only what per-call
   * copies may have written is cleared: pages never used stay untouched, so a big region (the KV
   * slab) costs resident memory only as it fills.
   */
  allocZeroed(bytes: number): Uint8Array | null {
    if (this.ex === null) return null;
    const dirty = Math.max(this.top, this.dirtyTop);
    const at = this.grab(bytes);
    const a = new Uint8Array(this.memory!.buffer, at, bytes);
    a.fill(0, 0, Math.max(0, Math.min(bytes, dirty - at)));
    return a;
  }

  /**
   * Gives back everything allocated from `at` (a usedBytes the caller read) to the top: the caller
   * owns all of it and keeps no view on it. The next allocations reuse the space (and its pages,
   * already resident) instead of stacking above it. Nothing to do on the fallback.
   */
  release(at: number): void {
    if (this.ex === null) return;
    if (this.queued > 0) assert.fail("kernel memory released while matmuls are queued: flush first");
    assert(at >= KERNEL_RESERVED_BYTES && at <= this.top && at % 16 === 0, `release to ${at} of ${this.top}`);
    this.top = at;
    this.tempTop = at;
  }

  /** Bytes living in the memory (null on the fallback); freed only by release. */
  allocBytes(bytes: number): Uint8Array | null {
    if (this.ex === null) return null;
    const at = this.grab(bytes);
    return new Uint8Array(this.memory!.buffer, at, bytes);
  }

  /** The kernels' exports, to call on arrays allocated here (null on the fallback). */
  get exports(): KernelExports | null {
    return this.ex;
  }

  /** Byte offset of an array allocated here, or -1 for any other array. */
  addressOf(a: ArrayBufferView): number {
    return this.buffers.has(a.buffer) ? a.byteOffset : -1;
  }

  /**
   * Elements from .. from + count of one row of m (a view, or any matrix) as f32 into out at
   * outAt: from a placed matrix's strips, or where m is not placed straight from m.
   */
  rowInto(wm: Matrix, wmFrom: number, count: number, out: Float32Array, outAt = 0): void {
    let m: SimpleMatrix = wm as SimpleMatrix;
    let from = wmFrom;
    if (isStacked(wm)) {
      const s = this.stackViews.get(wm) ?? wm;
      const i = partIndex(s, wmFrom, count);
      m = s.parts[i]!;
      from = wmFrom - partStart(s, i);
    }
    const p = this.find(m);
    if (p !== undefined) readStripRow(dtypeOf(m), this.views16, p.at, p.cols, from, count, out, outAt, p.fn === F16_SHIFTED);
    else if (m instanceof Float32Array) for (let i = 0; i < count; i++) out[outAt + i] = m[from + i]!;
    else dequantizeInto(m, from, count, out, outAt);
  }

  /** y = x W^T now: rows x (rows, n) against d rows of w from element wOff. */
  matmul(y: Float32Array, x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): void {
    this.queue(y, x, w, wOff, rows, n, d);
    this.flush();
  }

  /**
   * Adds y = x W^T to the next dispatch. Jobs of one dispatch run at once in any order, so no
   * job's y may be another's x (asserted); x and y are read and written only by `flush`.
   */
  queue(y: Float32Array, x: Float32Array, wm: Matrix, wmOff: number, rows: number, n: number, d: number): void {
    if (this.ex === null) {
      matmulRef(y, x, wm, wmOff, rows, n, d);
      return;
    }
    // A stacked matrix's layer is a matmul on the part that holds it.
    let w: SimpleMatrix = wm as SimpleMatrix;
    let wOff = wmOff;
    if (isStacked(wm)) {
      const s = this.stackViews.get(wm) ?? wm;
      const i = partIndex(s, wmOff, n * d);
      w = s.parts[i]!;
      wOff = wmOff - partStart(s, i);
    }
    const dt = dtypeOf(w);
    if (x.length < rows * n || y.length < rows * d || w.length < wOff + n * d) {
      assert.fail(`matmul ${rows}x${n} by ${d}x${n}: x ${x.length}, y ${y.length}, w ${w.length} from ${wOff}`);
    }
    const be = blockElems(dt);
    if (n % be !== 0 || wOff % be !== 0) assert.fail(`${dt} matmul needs whole blocks of ${be}: n ${n}, from ${wOff}`);
    if (this.queued === MAX_JOBS) this.flush();
    const p = this.placedFor(w, n);
    const inPlace = p !== undefined && wOff % n === 0;
    let wAt = inPlace ? p.at : -1;
    if (!inPlace) {
      wAt = this.temp(stripLayoutBytes(dt, d, n));
      packStrips(w, wOff, d, n, this.u8, wAt);
    }
    let xAt = this.addressOf(x);
    if (xAt < 0) {
      xAt = this.temp(rows * n * 4);
      this.f32.set(x.subarray(0, rows * n), xAt / 4);
    }
    let yAt = this.addressOf(y);
    const copyY = yAt < 0;
    if (copyY) yAt = this.temp(rows * d * 4);
    this.assertIndependent(x, xAt, y, yAt, rows * n, rows * d);
    const j = this.queued++;
    const b = j * JOB_INTS;
    const jobs = this.jobs;
    jobs[b + J_FN] = inPlace ? p.fn : KERNEL_INDEX[dt];
    jobs[b + J_Y] = yAt;
    jobs[b + J_X] = xAt;
    jobs[b + J_W] = wAt;
    jobs[b + J_ROWS] = rows;
    jobs[b + J_N] = n;
    jobs[b + J_D] = d;
    jobs[b + J_R0] = inPlace ? wOff / n : 0;
    this.outs[j] = copyY ? y : null;
    this.inputs[j] = x;
    this.queuedMacs += rows * n * d;
    if (n > this.maxCols) this.maxCols = n;
  }

  /** Where w lives in rows of n, placing a bare f32 matrix at its first call; undefined if not so placed. */
  private placedFor(w: SimpleMatrix, n: number): Placed | undefined {
    if (this.unplaced.has(w as Float32Array)) {
      // Placing takes permanent space, which the queued jobs' copies may occupy.
      this.flush();
      this.unplaced.delete(w as Float32Array);
      // Kept under the original too: a bare matrix's caller has no view to call with.
      if (w.length % n === 0) this.placed.set(w, this.placed.get(this.place(w, n))!);
    }
    const p = this.find(w);
    return p !== undefined && p.cols === n ? p : undefined;
  }

  /** Where a placed matrix lives, found by its view or (weakly) by its original. */
  private find(w: Matrix): Placed | undefined {
    return this.placed.get(w) ?? this.byOriginal.get(w);
  }

  /** Fails when the job about to be queued (x: xFloats at xAt, y: yFloats at yAt) feeds or is fed by a queued one. */
  private assertIndependent(x: Float32Array, xAt: number, y: Float32Array, yAt: number, xFloats: number, yFloats: number): void {
    const jobs = this.jobs;
    for (let j = 0; j < this.queued; j++) {
      const b = j * JOB_INTS;
      const feeds = this.inputs[j] === y || overlaps(yAt, yFloats, jobs[b + J_X]! >>> 0, jobs[b + J_ROWS]! * jobs[b + J_N]!);
      const fed = this.outs[j] === x || overlaps(xAt, xFloats, jobs[b + J_Y]! >>> 0, jobs[b + J_ROWS]! * jobs[b + J_D]!);
      if (feeds || fed) {
        assert.fail(`matmul queue: job ${this.queued}'s ${feeds ? "output" : "input"} is job ${j}'s ${feeds ? "input" : "output"}; flush between them`);
      }
    }
  }

  /** Runs the queued matmuls, split over the threads when they are big enough. */
  flush(): void {
    const count = this.queued;
    if (count === 0) return;
    this.quantizeQ8Inputs(this.ex!, count);
    // Each thread's scratch for a dequantized strip (32 bytes per column) and a strip's running
    // sums after it (kernels/assembly/matmul.ts' strip8x1), above the copies.
    this.dispatch(count, this.queuedMacs, align16(32 * this.maxCols) + 128);
    for (let j = 0; j < count; j++) {
      const y = this.outs[j]!;
      if (y !== null) {
        const b = j * JOB_INTS;
        const at = (this.jobs[b + J_Y]! >>> 0) / 4;
        y.set(this.f32.subarray(at, at + this.jobs[b + J_ROWS]! * this.jobs[b + J_D]!));
        this.outs[j] = null;
      }
      this.inputs[j] = null;
    }
    this.queued = 0;
    this.queuedMacs = 0;
    this.maxCols = 0;
    this.tempTop = this.top;
  }

  /**
   * Quantizes the x of every queued quantized job for its integer kernel (q8.ts, kquants.ts,
   * legacy.ts), in this dispatch's space, and points the job at it: once per x and layout, so
   * jobs sharing one (q, k, v; w1, w3) share it (q4_k, q5_k and q6_k share kquants.ts's layout).
   */
  private quantizeQ8Inputs(ex: KernelExports, count: number): void {
    const jobs = this.jobs;
    for (let j = 0; j < count; j++) {
      const b = j * JOB_INTS;
      const layout = quantLayout(jobs[b + J_FN]!);
      if (layout === 0) continue;
      const x = jobs[b + J_X]!;
      const rows = jobs[b + J_ROWS]!;
      const n = jobs[b + J_N]!;
      let at = -1;
      for (let i = 0; i < j && at < 0; i++) {
        const o = i * JOB_INTS;
        if (quantLayout(jobs[o + J_FN]!) === layout && this.q8From[i] === x && jobs[o + J_ROWS] === rows && jobs[o + J_N] === n) at = jobs[o + J_X]!;
      }
      if (at < 0) {
        at = this.temp(rows * ex.x_row_bytes(jobs[b + J_FN]!, n));
        this.quantizeRows(ex, at, x, layout, rows, n);
      }
      this.q8From[j] = x;
      jobs[b + J_X] = at;
    }
  }

  /**
   * rows token rows of n f32 at x quantized at `at` in `layout` (quantize_rows): a prefill's rows
   * split over the threads by rows (each row alone, so the same bytes), a few rows on this one.
   */
  private quantizeRows(ex: KernelExports, at: number, x: number, layout: number, rows: number, n: number): void {
    const threads = this.threads;
    if (threads === null || rows < QUANT_SPLIT_ROWS || !threads.available) {
      ex.quantize_rows(at, x, layout, n, 0, rows, rows);
      return;
    }
    writeRowsJob(this.rowsJob, J_QUANT_X, at, x, layout, n, rows);
    threads.run(ex, this.rowsJob, 1, 0, 0);
  }

  /**
   * h = silu(h) * g over n floats, both arrays in this memory (elementwise.ts' swiglu), shared
   * with the helper threads when there are enough: elementwise, so the same bits however cut.
   */
  swiglu(h: Float32Array, g: Float32Array, n: number): void {
    const ex = this.ex!;
    const threads = this.threads;
    if (this.queued > 0) this.flush();
    if (threads === null || n < SWIGLU_SPLIT || !threads.available) {
      ex.swiglu(this.addressOf(h), this.addressOf(g), n);
      return;
    }
    writeRowsJob(this.rowsJob, J_SWIGLU, this.addressOf(h), this.addressOf(g), n, SWIGLU_SPAN, Math.ceil(n / SWIGLU_SPAN));
    threads.run(ex, this.rowsJob, 1, 0, 0);
  }

  /**
   * Runs the attention dispatch whose parameters are at `params` (kernels/assembly/attention.ts):
   * `pieces` (sequence, KV head) pieces, shared with the helper threads when its `macs`
   * multiply-adds are worth the handoff. Each thread has `scratchBytes` of scratch of its own.
   */
  attend(params: number, pieces: number, macs: number, scratchBytes: number): void {
    if (this.queued > 0) this.flush();
    const jobs = this.jobs;
    jobs[J_FN] = J_ATTEND;
    jobs[J_W] = params;
    jobs[J_ROWS] = pieces;
    this.dispatch(1, pieces > 1 ? macs : 0, align16(scratchBytes));
    this.tempTop = this.top;
  }

  /**
   * Runs the `count` jobs written in `jobs`: shared with the helper threads when their `macs`
   * multiply-adds are worth the handoff (and no helper stalled lately), each thread with
   * `stride` bytes of scratch of its own above the dispatch's copies.
   */
  private dispatch(count: number, macs: number, stride: number): void {
    const ex = this.ex!;
    const threads = this.threads;
    const split = threads !== null && macs >= SPLIT_MACS && threads.available;
    const scratch = this.temp(stride * (split ? threads.helpers + 1 : 1));
    if (split) threads.run(ex, this.jobs, count, scratch, stride);
    else runJobs(ex, this.jobs, count, scratch, this.tiles, this.tileJobAt);
  }

  /**
   * Copies m into the memory in the strip layout, rows of `cols` (16-bit weights checked finite
   * on the way), and returns its view: a matrix like m over the copy.
   */
  private place(m: SimpleMatrix, cols: number): SimpleMatrix {
    const dt = dtypeOf(m);
    if (m.length % cols !== 0) assert.fail(`matrix of ${m.length} elements is not whole rows of ${cols}`);
    if (cols % blockElems(dt) !== 0) assert.fail(`${dt} matrix rows of ${cols}: not whole blocks of ${blockElems(dt)}`);
    const rows = m.length / cols;
    const bytes = stripLayoutBytes(dt, rows, cols);
    const at = this.grab(bytes);
    let staged = 0;
    let fn = KERNEL_INDEX[dt];
    packStrips(m, 0, rows, cols, this.u8, at, {
      staged: (d, src, r, n, a) => {
        const placed = this.placeForKernel(d, src, r, n, a, (b) => (staged += b));
        fn = placed?.fn ?? fn;
        return placed === null ? null : placed.bad;
      },
    });
    // The progress line moves a stage at a time where the kernels place, a matrix at a time elsewhere.
    this.placing?.add((m instanceof Float32Array ? m.byteLength : m.bytes.length) - staged);
    const buf = this.memory!.buffer;
    const v: SimpleMatrix =
      m instanceof Float32Array ? new Float32Array(buf, at, m.length) : { dtype: m.dtype, cols, length: m.length, bytes: new Uint8Array(buf, at, bytes) };
    this.placed.set(v, { at, cols, fn });
    return v;
  }

  /**
   * placeStaged for the kernel the rows' dtype takes, and f16 rows for F16_SHIFTED (the shifted
   * coding) unless one of them is 128 or more in magnitude: then over again in the plain one (a
   * second read of the rows, for a matrix that trained models seldom hold). Which kernel the
   * strips are for comes back beside placeStaged's answer.
   */
  private placeForKernel(dt: DType, src: Uint8Array, rows: number, n: number, at: number, staged: (bytes: number) => void): { bad: number; fn: number } | null {
    if (dt !== "f16") {
      const bad = this.placeStaged(KERNEL_INDEX[dt], dt, src, rows, n, at, staged);
      return bad === null ? null : { bad, fn: KERNEL_INDEX[dt] };
    }
    const bad = this.placeStaged(F16_SHIFTED, dt, src, rows, n, at, staged);
    if (bad === null) return null;
    if (bad < 0 || !finiteF16At(src, bad)) return { bad, fn: F16_SHIFTED };
    // Counted once: the first pass told `staged` and the progress line of the rows it placed.
    const plain = this.placeStaged(KERNEL_INDEX.f16, dt, src, rows, n, at, () => {}, false);
    return { bad: plain!, fn: KERNEL_INDEX.f16 };
  }

  /**
   * strip-layout.ts' KernelPlace: `rows` rows of n weights of dt as the file holds them (src: a
   * view of them, read with copyBytes, so a mapped file's pages are never touched) placed in the
   * strip layout for kernel fn (KERNEL_INDEX of dt, or F16_SHIFTED) at `at` by place-strips.ts on
   * every thread, placeStageBytes of rows at a time read into a stage above the top (each told to
   * `staged`, and to the progress line when `progress`). Returns the index of the first block with
   * an inf or NaN scale (f16: weight; F16_SHIFTED: the first weight it cannot hold; the rows before
   * it may be placed), else -1; null for a dtype the kernels do not place.
   */
  private placeStaged(
    fn: number,
    dt: DType,
    src: Uint8Array,
    rows: number,
    n: number,
    at: number,
    staged: (bytes: number) => void,
    progress = true,
  ): number | null {
    const ex = this.ex!;
    if (this.placeJs || ex.places(fn) === 0) return null;
    if (this.queued > 0) assert.fail("a matrix placed while matmuls are queued");
    const rowBytes = src.length / rows;
    const rowBlocks = n / blockElems(dt);
    const per = Math.max(STRIP_ROWS, Math.floor(this.placeStage / rowBytes / STRIP_ROWS) * STRIP_ROWS);
    const sb = stripBytes(dt, n);
    const threads = this.threads;
    // A 16-bit or q8_0 strip is a shuffle of the bytes, done faster than they are read: helpers
    // would only spin through each read (bench/load-quant.ts: 1B F16 0.77x, Q8_0 0.84x of one
    // thread's load at load 3-4). A K-quant or legacy one takes about as long as its read.
    const shared = threads !== null && (isK(dt) || isLegacy(dt));
    // Two stages where shared: the helpers place one while this thread reads the next into the
    // other. Unshared, the next is read after the last is placed: one will do.
    const stageBytes = Math.min(per, rows) * rowBytes;
    const first = this.temp(stageBytes);
    const stages = [first, shared ? this.temp(stageBytes) : first];
    /** Reads rows r .. r + per into stage s; the first bad block's index, else -1. */
    const read = (r: number, s: number): number => {
      const k = Math.min(per, rows - r);
      copyBytes(this.u8, stages[s]!, src.subarray(r * rowBytes, (r + k) * rowBytes));
      const bad = ex.first_bad(stages[s]!, fn, k * rowBlocks);
      return bad >= 0 ? r * rowBlocks + bad : -1;
    };
    // Unshared, the helpers write to the strips' fresh pages meanwhile (J_TOUCH), starting at the
    // far half and stealing the near one's from its back, away from this thread's writes: a first
    // write costs the host's zeroing of the page, 73% of an 8B Q8_0 load's samples (perf), and
    // on the AMD EPYC VM one vCPU first-touches 0.6-2.3 GB/s, two 2.4-5.3. 8B Q8_0, alternating
    // builds: placed in 6.4-10.4 s against 9.9-16.1.
    let touching = 0;
    if (!shared && threads !== null && threads.available) {
      writeTouchJob(this.jobs, at, Math.min(at + stripLayoutBytes(dt, rows, n), 2 ** 32 - 1));
      touching = threads.start(ex, this.jobs, 1, 0, 0);
    }
    try {
      let bad = read(0, 0);
      for (let r = 0, s = 0; bad < 0 && r < rows; r += per, s ^= 1) {
        const k = Math.min(per, rows - r);
        const j = this.jobs;
        writeRowsJob(j, J_PLACE, at + (r / STRIP_ROWS) * sb, stages[s]!, fn, n, k);
        const split = shared && k * n >= SPLIT_MACS && threads!.available;
        const total = split ? threads!.start(ex, j, 1, 0, 0) : 0;
        if (!split) runJobs(ex, j, 1, 0);
        if (r + per < rows) bad = read(r + per, s ^ 1);
        if (split) threads!.finish(ex, total);
        staged(k * rowBytes);
        if (progress) this.placing?.add(k * rowBytes);
      }
      return bad;
    } finally {
      if (touching > 0) threads!.finish(ex, touching);
      this.tempTop = this.top;
    }
  }

  /** Permanent space of `bytes` (16-byte aligned) at the top; the memory grows to hold it. */
  private grab(bytes: number): number {
    if (this.queued > 0) assert.fail("kernel memory allocated while matmuls are queued: flush first");
    const at = this.top;
    // Grown first: a memory that cannot grow (RangeError) leaves the top where it was.
    this.ensure(at + align16(bytes));
    this.top = at + align16(bytes);
    return at;
  }

  /** Space for this dispatch only, above the permanent top. */
  private temp(bytes: number): number {
    if (this.tempTop < this.top) this.tempTop = this.top;
    const at = this.tempTop;
    this.tempTop += align16(bytes);
    this.ensure(this.tempTop);
    if (this.tempTop > this.dirtyTop) this.dirtyTop = this.tempTop;
    return at;
  }

  private ensure(bytes: number): void {
    const mem = this.memory!;
    if (bytes > mem.buffer.byteLength) mem.grow(Math.ceil((bytes - mem.buffer.byteLength) / PAGE));
    if (this.u8.buffer !== mem.buffer) this.refresh();
  }

  private refresh(): void {
    const buf = this.memory!.buffer;
    this.buffers.add(buf);
    this.f32 = new Float32Array(buf);
    this.u8 = new Uint8Array(buf);
    this.views16 = { f32: this.f32, u8: this.u8, u16: new Uint16Array(buf), i8: new Int8Array(buf) };
  }
}

/** Which quantized x a kernel reads: 0 none (f32 x), 1 q8.ts's (q8_0 and the legacy types), 2 kquants.ts's. */
function quantLayout(fn: number): number {
  if (fn === KERNEL_INDEX.q4_k || fn === KERNEL_INDEX.q5_k || fn === KERNEL_INDEX.q6_k) return 2;
  if (fn === KERNEL_INDEX.q4_0 || fn === KERNEL_INDEX.q4_1 || fn === KERNEL_INDEX.q5_0 || fn === KERNEL_INDEX.q5_1) return 3;
  return fn === KERNEL_INDEX.q8_0 ? 1 : 0;
}

/** Whether f16 weight i of src (read with copyBytes) is finite. */
function finiteF16At(src: Uint8Array, i: number): boolean {
  const h = new Uint8Array(2);
  copyBytes(h, 0, src.subarray(2 * i, 2 * i + 2));
  return (h[1]! & 0x7c) !== 0x7c;
}

/** Whether float ranges [a, a + n) and [b, b + m) (byte offsets a, b) share memory. */
function overlaps(a: number, n: number, b: number, m: number): boolean {
  return a < b + 4 * m && b < a + 4 * n;
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

/** bytes rounded up to a multiple of 16, as a plain number: offsets reach 4 GiB, past int32's bit operators. */
function align16(bytes: number): number {
  return Math.ceil(bytes / 16) * 16;
}

let shared: MatmulKernel | null = null;

/** matmul on a process-wide kernel with nothing placed: w is copied in per call. */
export function matmul(y: Float32Array, x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): void {
  shared ??= new MatmulKernel();
  shared.matmul(y, x, w, wOff, rows, n, d);
}
