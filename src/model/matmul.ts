import assert from "node:assert";
import { simdModuleBytes } from "./simd-module.ts";

/**
 * y[r*d + i] = dot(w[wOff + i*n .. + n), x[r*n .. + n))  for r < rows, i < d, every dot summed
 * in one fixed order (see simd-module.ts): four f32 lanes over j = l (mod 4), folded as
 * (s0 + s1) + (s2 + s3), then the n % 4 tail in order. This is the plain JS statement of that
 * order: the bit-for-bit reference for the SIMD kernel, and its fallback. JS forbids fused
 * multiply-add, and Math.fround after every product and sum gives f32 arithmetic exactly.
 */
export function matmulRef(y: Float32Array, x: Float32Array, w: Float32Array, wOff: number, rows: number, n: number, d: number): void {
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
const MAX_PLACED_BYTES = 2 ** 32 - 2 ** 28;

interface SimdExports {
  matmul(y: number, x: number, w: number, rows: number, n: number, d: number): void;
}

let compiled: WebAssembly.Module | null | undefined;

/** The SIMD module, compiled once per process; null where the engine lacks WebAssembly SIMD. */
function simdModule(): WebAssembly.Module | null {
  if (compiled === undefined) {
    const bytes = simdModuleBytes();
    compiled = typeof WebAssembly === "object" && WebAssembly.validate(bytes) ? new WebAssembly.Module(bytes) : null;
  }
  return compiled;
}

/**
 * A matmul over WebAssembly linear memory. The tensors given to the constructor are copied into
 * the memory once and used from there; any other w has the rows it needs copied in per call (tests,
 * micro-benchmarks). x is copied in and y out per call: rows*(n+d) floats against rows*n*d
 * multiply-adds. Without WebAssembly SIMD, or for weights past wasm32's reach, every call runs
 * matmulRef, which gives the same bits. Placing doubles the weights' memory while the caller
 * keeps its own arrays.
 */
export class MatmulKernel {
  private readonly mem: WebAssembly.Memory | null;
  private readonly ex: SimdExports | null;
  private f32 = new Float32Array(0);
  private readonly placed = new Map<Float32Array, number>();
  /** Byte offset where scratch (x, y, unplaced w) starts: after every placed tensor. */
  private scratch = 0;

  constructor(tensors: readonly Float32Array[] = []) {
    const mod = simdModule();
    let bytes = 0;
    const unique = [...new Set(tensors)];
    for (const t of unique) bytes += align16(t.byteLength);
    // Weights past wasm32's 4 GiB (less scratch), or more than the engine will map, cannot be
    // placed: such a model runs matmulRef.
    let mem: WebAssembly.Memory | null = null;
    if (mod !== null && bytes <= MAX_PLACED_BYTES) {
      try {
        mem = new WebAssembly.Memory({ initial: Math.max(1, Math.ceil(bytes / PAGE)) });
      } catch (e) {
        if (!(e instanceof RangeError)) throw e;
      }
    }
    if (mod === null || mem === null) {
      this.mem = null;
      this.ex = null;
      return;
    }
    this.mem = mem;
    this.ex = new WebAssembly.Instance(mod, { env: { mem: this.mem } }).exports as unknown as SimdExports;
    this.f32 = new Float32Array(this.mem.buffer);
    for (const t of unique) {
      this.placed.set(t, this.scratch);
      this.f32.set(t, this.scratch >> 2);
      this.scratch += align16(t.byteLength);
    }
  }

  /** True when the SIMD module runs; false on the matmulRef fallback. */
  get simd(): boolean {
    return this.ex !== null;
  }

  matmul(y: Float32Array, x: Float32Array, w: Float32Array, wOff: number, rows: number, n: number, d: number): void {
    const ex = this.ex;
    if (ex === null) {
      matmulRef(y, x, w, wOff, rows, n, d);
      return;
    }
    if (x.length < rows * n || y.length < rows * d || w.length < wOff + n * d) {
      assert.fail(`matmul ${rows}x${n} by ${d}x${n}: x ${x.length}, y ${y.length}, w ${w.length} from ${wOff}`);
    }
    const at = this.placed.get(w);
    const xAt = this.scratch;
    const yAt = xAt + align16(rows * n * 4);
    const wAt = yAt + align16(rows * d * 4);
    this.ensure(at === undefined ? wAt + n * d * 4 : wAt);
    const f32 = this.f32;
    // set() over subarray views (two small allocations per call): an element loop over a
    // typed array on wasm memory ran the whole rows=1 call at half speed on Bun.
    f32.set(x.subarray(0, rows * n), xAt >> 2);
    let wPtr: number;
    if (at === undefined) {
      f32.set(w.subarray(wOff, wOff + n * d), wAt >> 2);
      wPtr = wAt;
    } else {
      wPtr = at + wOff * 4;
    }
    ex.matmul(yAt, xAt, wPtr, rows, n, d);
    y.set(f32.subarray(yAt >> 2, (yAt >> 2) + rows * d));
  }

  private ensure(bytes: number): void {
    const mem = this.mem!;
    if (bytes <= mem.buffer.byteLength) return;
    mem.grow(Math.ceil((bytes - mem.buffer.byteLength) / PAGE));
    this.f32 = new Float32Array(mem.buffer);
  }
}

function align16(bytes: number): number {
  return (bytes + 15) & ~15;
}

let shared: MatmulKernel | null = null;

/** matmul on a process-wide kernel with nothing placed: w is copied in per call. */
export function matmul(y: Float32Array, x: Float32Array, w: Float32Array, wOff: number, rows: number, n: number, d: number): void {
  shared ??= new MatmulKernel();
  shared.matmul(y, x, w, wOff, rows, n, d);
}
