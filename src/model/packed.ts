import assert from "node:assert";
import { copyBytes } from "./mapped-file.ts";

/** How a weight matrix is held in memory. */
export type DType = "f32" | "f16" | "bf16" | "q8_0";
export const DTYPES: readonly DType[] = ["f32", "f16", "bf16", "q8_0"];

/** ggml's Q8_0: blocks of QK weights, each an f16 scale then QK int8 (8.5 bits per weight). */
export const QK8_0 = 32;
export const Q8_0_BLOCK_BYTES = 2 + QK8_0;

/**
 * A matrix kept in a 16-bit or q8_0 dtype: `bytes` holds its `length` elements row-major, rows of
 * `cols` elements (q8_0 rows are whole blocks, so cols % 32 === 0). The kernels read these bytes
 * directly; nothing here is inflated to f32.
 *
 * A matrix stacked from layers (stackedPacked) has `parts`, each whole rows, views of the file
 * where it allows: placing it in the kernel memory reads the parts and never makes `bytes`, which
 * is built (and kept) only when something reads it, so a model is not held twice while loading.
 */
export interface PackedMatrix {
  readonly dtype: "f16" | "bf16" | "q8_0";
  readonly cols: number;
  readonly length: number;
  readonly bytes: Uint8Array;
  readonly parts?: readonly Uint8Array[];
}

/** A packed matrix whose rows are the parts' in order; its `bytes` are put together on first read. */
export function stackedPacked(dtype: PackedMatrix["dtype"], cols: number, parts: readonly Uint8Array[]): PackedMatrix {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const rowBytes = matrixBytes(dtype, cols);
  if (total % rowBytes !== 0 || parts.some((p) => p.length % rowBytes !== 0)) assert.fail(`parts of ${total} bytes are not whole rows of ${rowBytes}`);
  let made: Uint8Array | null = null;
  return {
    dtype,
    cols,
    length: (total / rowBytes) * cols,
    parts,
    get bytes(): Uint8Array {
      if (made === null) {
        made = new Uint8Array(total);
        let at = 0;
        for (const p of parts) {
          copyBytes(made, at, p);
          at += p.length;
        }
      }
      return made;
    },
  };
}

/** Bytes a matrix takes, without making a stacked one's `bytes`. */
export function matrixByteLength(m: Matrix): number {
  return m instanceof Float32Array ? m.byteLength : matrixBytes(m.dtype, m.length);
}

/**
 * Bytes from .. to of a packed matrix's row-major bytes into dst at `at`: from its parts when it
 * has them (a mapped file's pages read, never touched: copyBytes), else from `bytes`.
 */
export function copyMatrixBytes(m: PackedMatrix, from: number, to: number, dst: Uint8Array, at: number): void {
  if (m.parts === undefined) {
    copyBytes(dst, at, m.bytes.subarray(from, to));
    return;
  }
  let base = 0;
  for (const p of m.parts) {
    const lo = Math.max(from, base);
    const hi = Math.min(to, base + p.length);
    if (lo < hi) copyBytes(dst, at + lo - from, p.subarray(lo - base, hi - base));
    base += p.length;
    if (base >= to) break;
  }
}

/** A weight matrix: plain f32 (what every loader can hand over) or packed. */
export type Matrix = Float32Array | PackedMatrix;

export function dtypeOf(m: Matrix): DType {
  return m instanceof Float32Array ? "f32" : m.dtype;
}

/** Bytes of `elems` consecutive elements (whole q8_0 blocks). */
export function matrixBytes(dtype: DType, elems: number): number {
  if (dtype === "f32") return elems * 4;
  if (dtype === "q8_0") return (elems / QK8_0) * Q8_0_BLOCK_BYTES;
  return elems * 2;
}

// f16 bits -> value, exact (the engine's own Float16Array conversion, tabulated once).
let f16Table: Float32Array | null = null;
export function f16Values(): Float32Array {
  if (f16Table === null) {
    const bits = new Uint16Array(65536);
    for (let i = 0; i < 65536; i++) bits[i] = i;
    f16Table = new Float32Array(new Float16Array(bits.buffer));
  }
  return f16Table;
}

const bf16Scratch = new Float32Array(1);
const bf16Bits = new Uint32Array(bf16Scratch.buffer);

/** f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN. */
function toBf16(x: number): number {
  bf16Scratch[0] = x;
  const b = bf16Bits[0]!;
  if ((b & 0x7fffffff) > 0x7f800000) return ((b >>> 16) | 0x40) & 0xffff;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/**
 * q8_0 quantization as ggml's reference: per block d = max|x| / 127, q = round(x / d) (ties
 * away from zero), d stored as f16; x / d computed as x * (1 / d) in f32.
 */
function quantizeQ8Row(src: Float32Array, from: number, cols: number, out: DataView, q: Int8Array, at: number): void {
  const f = Math.fround;
  for (let b = 0; b < cols; b += QK8_0, at += Q8_0_BLOCK_BYTES) {
    const s = from + b;
    let amax = 0;
    for (let j = 0; j < QK8_0; j++) {
      const a = src[s + j]!;
      const m = a < 0 ? -a : a;
      if (m > amax) amax = m;
    }
    const d = f(amax / 127);
    const id = d !== 0 ? f(1 / d) : 0;
    out.setFloat16(at, d, true);
    // Halves away from zero, as ggml's roundf: floor(|v| + 0.5) is exact for |v| <= 127.5.
    for (let j = 0; j < QK8_0; j++) {
      const v = f(src[s + j]! * id);
      q[at + 2 + j] = v < 0 ? -Math.floor(0.5 - v) : Math.floor(v + 0.5);
    }
  }
}

/** m in `dtype` (m itself when it already is); rows of `cols` elements. `onBytes` hears of each part's source bytes as it is done. */
export function castMatrix(m: Matrix, dtype: DType, cols: number, onBytes: (n: number) => void = () => {}): Matrix {
  if (dtypeOf(m) === dtype) return m;
  if (dtype === "f32") return dequantize(m as PackedMatrix);
  if (m.length % cols !== 0) assert.fail(`matrix of ${m.length} elements is not whole rows of ${cols}`);
  if (dtype === "q8_0" && cols % QK8_0 !== 0) throw new Error(`q8_0 needs rows that are whole blocks of ${QK8_0}: a row has ${cols}`);
  if (m instanceof Float32Array) return { dtype, cols, length: m.length, bytes: castRows(m, m.length / cols, cols, dtype) };
  // A stacked matrix is converted part by part and stays in parts (layer groups take them).
  if (m.parts !== undefined) {
    return stackedPacked(
      dtype,
      cols,
      m.parts.map((p) => {
        const out = castPackedBytes(m.dtype, p, cols, dtype);
        onBytes(p.length);
        return out;
      }),
    );
  }
  return { dtype, cols, length: m.length, bytes: castPackedBytes(m.dtype, m.bytes, cols, dtype) };
}

/** Rows read into this much staging at a time when converting a packed matrix. */
const STAGE_BYTES = 1 << 22;

/**
 * The rows in `bytes` (packed in `from`) converted to `to`, read a few MB at a time through a
 * staging buffer with copyBytes (a mapped file's pages are read, never touched, so a converted
 * model never counts the file in this process's RSS) and made f32 one row at a time (exactly).
 */
function castPackedBytes(from: PackedMatrix["dtype"], bytes: Uint8Array, cols: number, to: DType): Uint8Array {
  const rowBytes = matrixBytes(from, cols);
  const rows = bytes.length / rowBytes;
  const chunk = Math.max(1, Math.floor(STAGE_BYTES / rowBytes));
  const stage = new Uint8Array(Math.min(rows, chunk) * rowBytes);
  const out = new Uint8Array(matrixBytes(to, rows * cols));
  const views = outViews(out);
  const row = new Float32Array(cols);
  for (let r0 = 0; r0 < rows; r0 += chunk) {
    const k = Math.min(chunk, rows - r0);
    copyBytes(stage, 0, bytes.subarray(r0 * rowBytes, (r0 + k) * rowBytes));
    const staged: PackedMatrix = { dtype: from, cols, length: k * cols, bytes: stage.subarray(0, k * rowBytes) };
    for (let r = 0; r < k; r++) {
      dequantizeInto(staged, r * cols, cols, row);
      castRowInto(row, 0, cols, to, views, r0 + r);
    }
  }
  return out;
}

/** rows rows of f32 src in dtype `to`. */
function castRows(src: Float32Array, rows: number, cols: number, to: DType): Uint8Array {
  const out = new Uint8Array(matrixBytes(to, rows * cols));
  const views = outViews(out);
  for (let r = 0; r < rows; r++) castRowInto(src, r * cols, cols, to, views, r);
  return out;
}

interface OutViews {
  f16: Float16Array;
  u16: Uint16Array;
  dv: DataView;
  i8: Int8Array;
}

/** Views of a fresh (even-length) output buffer, made once per conversion, not per row. */
function outViews(out: Uint8Array): OutViews {
  const half = out.byteLength >> 1;
  return {
    f16: new Float16Array(out.buffer, out.byteOffset, half),
    u16: new Uint16Array(out.buffer, out.byteOffset, half),
    dv: new DataView(out.buffer, out.byteOffset, out.byteLength),
    i8: new Int8Array(out.buffer, out.byteOffset, out.byteLength),
  };
}

/** One row of f32 (src from `at`) as row r of the output, in dtype `to` (f16, bf16 or q8_0). */
function castRowInto(src: Float32Array, at: number, cols: number, to: DType, out: OutViews, r: number): void {
  if (to === "f16") out.f16.set(src.subarray(at, at + cols), r * cols);
  else if (to === "bf16") for (let i = 0; i < cols; i++) out.u16[r * cols + i] = toBf16(src[at + i]!);
  else quantizeQ8Row(src, at, cols, out.dv, out.i8, r * matrixBytes("q8_0", cols));
}

// Views of each matrix's bytes, made once: dequantizing an embedding row per token allocates nothing.
const views = new WeakMap<PackedMatrix, { u16: Uint16Array; dv: DataView }>();
function viewsOf(m: PackedMatrix): { u16: Uint16Array; dv: DataView } {
  let v = views.get(m);
  if (v === undefined) {
    const b = m.bytes;
    v = { u16: new Uint16Array(b.buffer, b.byteOffset, b.byteLength >> 1), dv: new DataView(b.buffer, b.byteOffset, b.byteLength) };
    views.set(m, v);
  }
  return v;
}

/**
 * Elements from .. from+count of a packed matrix as f32 (exact: every packed value is an f32),
 * into out at outAt. Whole q8_0 blocks only.
 */
export function dequantizeInto(m: PackedMatrix, from: number, count: number, out: Float32Array, outAt = 0): void {
  const { u16, dv } = viewsOf(m);
  if (m.dtype === "f16") {
    const lut = f16Values();
    for (let i = 0; i < count; i++) out[outAt + i] = lut[u16[from + i]!]!;
  } else if (m.dtype === "bf16") {
    for (let i = 0; i < count; i++) {
      bf16Bits[0] = u16[from + i]! << 16;
      out[outAt + i] = bf16Scratch[0]!;
    }
  } else {
    if (from % QK8_0 !== 0 || count % QK8_0 !== 0) assert.fail(`q8_0 dequantize ${from}+${count}: not whole blocks`);
    const lut = f16Values();
    for (let b = 0; b < count; b += QK8_0) {
      const at = ((from + b) / QK8_0) * Q8_0_BLOCK_BYTES;
      const d = lut[dv.getUint16(at, true)]!;
      for (let j = 0; j < QK8_0; j++) out[outAt + b + j] = Math.fround(d * dv.getInt8(at + 2 + j));
    }
  }
}

export function dequantize(m: PackedMatrix): Float32Array {
  const out = new Float32Array(m.length);
  dequantizeInto(m, 0, m.length, out);
  return out;
}

/**
 * Throws when an f16 matrix (or a q8_0 scale) holds inf or NaN: the kernels convert f16 by
 * shifting and rebiasing, exact for every finite value only.
 */
export function assertFinite16(m: PackedMatrix): void {
  const { u16 } = viewsOf(m);
  if (m.dtype === "f16") {
    for (let i = 0; i < m.length; i++) if ((u16[i]! & 0x7c00) === 0x7c00) throw new Error(`f16 weight ${i} is inf or NaN (0x${u16[i]!.toString(16)})`);
  } else if (m.dtype === "q8_0") {
    const { dv } = viewsOf(m);
    for (let at = 0; at < m.bytes.byteLength; at += Q8_0_BLOCK_BYTES) {
      const h = dv.getUint16(at, true);
      if ((h & 0x7c00) === 0x7c00) throw new Error(`q8_0 block ${at / Q8_0_BLOCK_BYTES} has an inf or NaN scale (0x${h.toString(16)})`);
    }
  }
}
