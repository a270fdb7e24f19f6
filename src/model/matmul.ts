import assert from "node:assert";
import { KERNELS_WASM_BASE64 } from "./kernels/kernels-wasm.ts";
import { KernelThreads, type KernelName } from "./kernel-threads.ts";
import type { LayerKernelExports } from "./layer-kernels.ts";
import { copyBytes } from "./mapped-file.ts";
import { assertFinite16, dequantizeInto, dtypeOf, matrixBytes, type DType, type Matrix } from "./packed.ts";

/**
 * y[r*d + i] = dot(w[wOff + i*n .. + n), x[r*n .. + n))  for r < rows, i < d, every dot summed
 * in one fixed order (see kernels/assembly/matmul.ts): four f32 lanes over j = l (mod 4), folded
 * as (s0 + s1) + (s2 + s3), then the n % 4 tail in order. This is the plain JS statement of that
 * order: the bit-for-bit reference for every dtype's kernel (a packed w is first made f32, which
 * is exact), and their fallback. JS forbids fused multiply-add, and Math.fround after every
 * product and sum gives f32 arithmetic exactly.
 */
export function matmulRef(y: Float32Array, x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): void {
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

const PAGE = 65536;
/** wasm32 addresses 4 GiB; weights past this (less room for activations) run matmulRef. */
const MAX_PAGES = 65536;
const MAX_PLACED_BYTES = 2 ** 32 - 2 ** 28;
/**
 * Bytes at the start of the memory left to the kernels' static data (AssemblyScript's expf
 * table): every instantiation, each helper thread's too, writes its data segments there.
 */
export const KERNEL_RESERVED_BYTES = 65536;
/** Multiply-adds below which a matmul stays on the calling thread: waking helpers costs more. */
const SPLIT_MACS = 1 << 16;

export interface KernelOptions {
  /** Threads a large matmul's output rows are split over, the caller included (default 1). */
  threads?: number;
  /** false: the plain-JS fallback even where SIMD runs (tests hold the two paths together). */
  simd?: boolean;
}

type KernelFn = (y: number, x: number, w: number, rows: number, n: number, d: number, i0: number, i1: number) => void;
export type KernelExports = Record<`matmul_${DType}`, KernelFn> & LayerKernelExports;

const KERNEL: Record<DType, KernelName> = { f32: "matmul_f32", f16: "matmul_f16", bf16: "matmul_bf16", q8_0: "matmul_q8_0" };

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

/**
 * Matmuls over one shared WebAssembly memory. The matrices given to the constructor are copied
 * into it once, in their own dtype, and used from there through `views` (the kernel keeps no
 * reference to the originals, so a caller that drops them holds each weight once); any other w
 * has the rows it needs copied
 * in per call (tests, micro-benchmarks). Activations allocated with `alloc` live in the memory
 * too and go to the kernel in place; other x and y are copied in and out per call. Without
 * WebAssembly SIMD, or for weights past wasm32's reach, every call runs matmulRef, which gives
 * the same bits.
 */
export class MatmulKernel {
  readonly memory: WebAssembly.Memory | null;
  private readonly ex: KernelExports | null;
  private f32 = new Float32Array(0);
  private u8 = new Uint8Array(0);
  /** Placed matrices by their views (never the originals, so those can be collected). */
  private readonly placed = new Map<Matrix, number>();
  /**
   * The constructor's tensors, index for index, as views on their copies in the memory (the
   * tensors themselves on the fallback). Call matmul with these: the originals are not kept.
   */
  readonly views: readonly Matrix[];
  /** Every SharedArrayBuffer object the memory has shown (one per size): views on any are ours. */
  private readonly buffers = new Set<ArrayBufferLike>();
  /** Byte offset where unallocated space (per-call copies) starts. */
  private top = KERNEL_RESERVED_BYTES;
  private threads: KernelThreads | null = null;

  constructor(tensors: readonly Matrix[] = [], opts: KernelOptions = {}) {
    const mod = opts.simd === false ? null : kernelModule();
    const unique = [...new Set(tensors)];
    let bytes = 0;
    for (const t of unique) bytes += align16(byteLengthOf(t));
    const mem = mod !== null && bytes <= MAX_PLACED_BYTES ? sharedMemory(Math.ceil((KERNEL_RESERVED_BYTES + bytes) / PAGE)) : null;
    if (mod === null || mem === null) {
      for (const t of unique) if (!(t instanceof Float32Array)) assertFinite16(t);
      this.memory = null;
      this.ex = null;
      this.views = tensors;
      return;
    }
    this.memory = mem;
    this.ex = new WebAssembly.Instance(mod, { env: { memory: mem } }).exports as unknown as KernelExports;
    this.refresh();
    const viewOf = new Map<Matrix, Matrix>();
    for (const t of unique) {
      const v = viewAt(t, this.memory.buffer, this.top);
      copyBytes(this.u8, this.top, bytesOf(t));
      this.placed.set(v, this.top);
      viewOf.set(t, v);
      this.top += align16(byteLengthOf(t));
    }
    // Checked on the copies: reading a mapped file's originals would page every page of it in.
    for (const v of viewOf.values()) if (!(v instanceof Float32Array)) assertFinite16(v);
    this.views = tensors.map((t) => viewOf.get(t)!);
    const threads = opts.threads ?? 1;
    if (!(Number.isInteger(threads) && threads >= 1)) throw new Error(`threads ${threads}: want a positive integer`);
    if (threads > 1) this.threads = new KernelThreads(mod, mem, threads - 1);
  }

  /** Threads that run large matmuls (1 on the fallback). */
  get threadCount(): number {
    return this.threads === null ? 1 : this.threads.helpers + 1;
  }

  /** Calls whose rows were shared with helper threads (tests check the threads work). */
  get splitCalls(): number {
    return this.threads?.splitCalls ?? 0;
  }

  /** Settles when every helper thread runs (until then the caller does their share). */
  ready(): Promise<void> {
    return this.threads?.ready ?? Promise.resolve();
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

  /** Byte offset of a placed matrix (for threads that share the memory), or -1. */
  offsetOf(w: Matrix): number {
    return this.placed.get(w) ?? -1;
  }

  /** A zeroed f32 array living in the memory (a plain array on the fallback); never freed. */
  alloc(floats: number): Float32Array {
    if (this.ex === null) return new Float32Array(floats);
    const at = this.top;
    this.top += align16(floats * 4);
    this.ensure(this.top);
    const a = new Float32Array(this.memory!.buffer, at, floats);
    a.fill(0);
    return a;
  }

  /** Bytes living in the memory (null on the fallback); never freed. */
  allocBytes(bytes: number): Uint8Array | null {
    if (this.ex === null) return null;
    const at = this.top;
    this.top += align16(bytes);
    this.ensure(this.top);
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

  matmul(y: Float32Array, x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): void {
    const ex = this.ex;
    if (ex === null) {
      matmulRef(y, x, w, wOff, rows, n, d);
      return;
    }
    const dt = dtypeOf(w);
    if (x.length < rows * n || y.length < rows * d || w.length < wOff + n * d) {
      assert.fail(`matmul ${rows}x${n} by ${d}x${n}: x ${x.length}, y ${y.length}, w ${w.length} from ${wOff}`);
    }
    if (dt === "q8_0" && (n % 32 !== 0 || wOff % 32 !== 0)) assert.fail(`q8_0 matmul needs whole blocks: n ${n}, from ${wOff}`);
    let top = this.top;
    let xAt = this.addressOf(x);
    let yAt = this.addressOf(y);
    const inX = xAt < 0;
    const inY = yAt < 0;
    if (inX) (xAt = top), (top += align16(rows * n * 4));
    if (inY) (yAt = top), (top += align16(rows * d * 4));
    const wBytes = matrixBytes(dt, n * d);
    let wAt = this.placed.get(w);
    const copyW = wAt === undefined;
    if (copyW) wAt = top;
    this.ensure(copyW ? top + wBytes : top);
    if (inX) this.f32.set(x.subarray(0, rows * n), xAt >> 2);
    if (copyW) this.u8.set(bytesOf(w).subarray(matrixBytes(dt, wOff), matrixBytes(dt, wOff) + wBytes), wAt!);
    else wAt! += matrixBytes(dt, wOff);
    const parts = this.threads === null || rows * n * d < SPLIT_MACS ? 1 : Math.min(this.threads.helpers + 1, Math.ceil(d / 8));
    if (parts > 1) this.threads!.run(ex, KERNEL[dt], yAt, xAt, wAt!, rows, n, d, parts);
    else ex[KERNEL[dt]](yAt, xAt, wAt!, rows, n, d, 0, d);
    if (inY) y.set(this.f32.subarray(yAt >> 2, (yAt >> 2) + rows * d));
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
  }
}

function byteLengthOf(m: Matrix): number {
  return m instanceof Float32Array ? m.byteLength : m.bytes.byteLength;
}

/** A matrix like m over the bytes at `at` of buf. */
function viewAt(m: Matrix, buf: ArrayBufferLike, at: number): Matrix {
  if (m instanceof Float32Array) return new Float32Array(buf, at, m.length);
  return { dtype: m.dtype, cols: m.cols, length: m.length, bytes: new Uint8Array(buf, at, m.bytes.byteLength) };
}

function bytesOf(m: Matrix): Uint8Array {
  return m instanceof Float32Array ? new Uint8Array(m.buffer, m.byteOffset, m.byteLength) : m.bytes;
}

function align16(bytes: number): number {
  return (bytes + 15) & ~15;
}

let shared: MatmulKernel | null = null;

/** matmul on a process-wide kernel with nothing placed: w is copied in per call. */
export function matmul(y: Float32Array, x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): void {
  shared ??= new MatmulKernel();
  shared.matmul(y, x, w, wOff, rows, n, d);
}
