import assert from "node:assert";
import { f16Values } from "./f16-bits.ts";
import { copyBytes } from "./mapped-file.ts";
import { assertFiniteLegacy, dequantizeLegacyInto, isLegacy, LEGACY_DTYPES, type LegacyDType, legacyShape, QK_LEGACY } from "./legacy-quants.ts";
import { assertFiniteK, dequantizeKInto, isK, type KDType, kBlockBytes, QK_K, quantizeQ4K, quantizeQ5K, quantizeQ6K } from "./k-quants.ts";

export { f16Values };

/** How a weight matrix is held in memory. */
export type DType = "f32" | "f16" | "bf16" | "q8_0" | KDType | LegacyDType;
export const DTYPES: readonly DType[] = ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k", ...LEGACY_DTYPES];

/** ggml's Q8_0: blocks of QK weights, each an f16 scale then QK int8 (8.5 bits per weight). */
export const QK8_0 = 32;
export const Q8_0_BLOCK_BYTES = 2 + QK8_0;

/** Elements of one block of a dtype (1 for the plain ones): a row of a packed matrix is whole blocks. */
export function blockElems(dtype: DType): number {
  return dtype === "q8_0" ? QK8_0 : isK(dtype) ? QK_K : isLegacy(dtype) ? QK_LEGACY : 1;
}

/**
 * A matrix kept in a 16-bit or quantized dtype: `bytes` holds its `length` elements row-major,
 * rows of `cols` elements (quantized rows are whole blocks: cols % blockElems === 0), in ggml's
 * block format for q8_0, q4_k and q6_k. The kernels read these bytes directly; nothing here is
 * inflated to f32.
 */
export interface PackedMatrix {
  readonly dtype: Exclude<DType, "f32">;
  readonly cols: number;
  readonly length: number;
  readonly bytes: Uint8Array;
}

/** A matrix of one dtype: plain f32 (what every loader can hand over) or packed. */
export type SimpleMatrix = Float32Array | PackedMatrix;

/**
 * A weight's layers stacked along its rows when their stored dtypes differ (a Q4_K_M file keeps
 * some layers' ffn_down and attn_v in q6_k, the others in q4_k): parts of whole rows, in order,
 * each held in its own dtype. A matmul or a row read stays inside one part.
 */
export interface StackedMatrix {
  readonly dtype: "stacked";
  readonly cols: number;
  readonly length: number;
  readonly parts: readonly SimpleMatrix[];
}

/** A weight matrix: of one dtype, or layers of several. */
export type Matrix = SimpleMatrix | StackedMatrix;

export function isStacked(m: Matrix): m is StackedMatrix {
  return !(m instanceof Float32Array) && m.dtype === "stacked";
}

export function dtypeOf(m: SimpleMatrix): DType {
  return m instanceof Float32Array ? "f32" : m.dtype;
}

/** The dtype of each part ("f32", "q4_k", ...; a stacked matrix's joined with "+"). */
export function dtypeNameOf(m: Matrix): string {
  return isStacked(m) ? [...new Set(m.parts.map(dtypeOf))].sort().join("+") : dtypeOf(m);
}

/** Bytes m takes as held (every part's). */
export function heldBytesOf(m: Matrix): number {
  if (isStacked(m)) return m.parts.reduce((t, p) => t + heldBytesOf(p), 0);
  return m instanceof Float32Array ? m.byteLength : m.bytes.byteLength;
}

/**
 * The index of the part of m holding elements from .. from + count (throws when they span two
 * parts); partStart gives where it starts. Two numbers, so a matmul per token allocates nothing.
 */
export function partIndex(m: StackedMatrix, from: number, count: number): number {
  let at = from;
  for (let i = 0; i < m.parts.length; i++) {
    const len = m.parts[i]!.length;
    if (at < len) {
      if (at + count > len) assert.fail(`elements ${from}+${count} span two parts of a stacked matrix`);
      return i;
    }
    at -= len;
  }
  return assert.fail(`element ${from} is past a stacked matrix of ${m.length}`);
}

/** The element where part i of m starts. */
export function partStart(m: StackedMatrix, i: number): number {
  let at = 0;
  for (let k = 0; k < i; k++) at += m.parts[k]!.length;
  return at;
}

/** Bytes of `elems` consecutive elements (whole q8_0 blocks). */
export function matrixBytes(dtype: DType, elems: number): number {
  if (dtype === "f32") return elems * 4;
  if (dtype === "q8_0") return (elems / QK8_0) * Q8_0_BLOCK_BYTES;
  if (isK(dtype)) return (elems / QK_K) * kBlockBytes(dtype);
  if (isLegacy(dtype)) return (elems / QK_LEGACY) * legacyShape(dtype).bytes;
  return elems * 2;
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

/**
 * m in `dtype` (m itself when it already is); rows of `cols` elements. A stacked matrix is
 * converted part by part and stays stacked (layer groups take its parts); `onBytes` hears of
 * each part's source bytes as it is done.
 */
export function castMatrix(m: Matrix, dtype: DType, cols: number, onBytes: (n: number) => void = () => {}): Matrix {
  if (isStacked(m)) {
    const parts = m.parts.map((p) => {
      const out = castMatrix(p, dtype, cols) as SimpleMatrix;
      onBytes(heldBytesOf(p));
      return out;
    });
    return { dtype: "stacked", cols, length: m.length, parts };
  }
  if (dtypeOf(m) === dtype) return m;
  if (dtype === "f32") return dequantize(m as PackedMatrix);
  if (isLegacy(dtype)) throw new Error(`${dtype}: this engine holds ${dtype} matrices as a file stores them, but does not quantize to it`);
  if (m.length % cols !== 0) assert.fail(`matrix of ${m.length} elements is not whole rows of ${cols}`);
  if (cols % blockElems(dtype) !== 0) throw new Error(`${dtype} needs rows that are whole blocks of ${blockElems(dtype)}: a row has ${cols}`);
  if (isK(dtype)) {
    // The K quantizers take whole super-blocks of f32 (the bench's and tests' way in).
    const src = m instanceof Float32Array ? m : dequantize(m);
    const bytes = new Uint8Array(matrixBytes(dtype, src.length));
    if (dtype === "q4_k") quantizeQ4K(src, 0, src.length, bytes, 0);
    else if (dtype === "q5_k") quantizeQ5K(src, 0, src.length, bytes, 0);
    else quantizeQ6K(src, 0, src.length, bytes, 0);
    return { dtype, cols, length: src.length, bytes };
  }
  if (m instanceof Float32Array) return { dtype, cols, length: m.length, bytes: castRows(m, m.length / cols, cols, dtype) };
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
  else if (to === "q8_0") quantizeQ8Row(src, at, cols, out.dv, out.i8, r * matrixBytes("q8_0", cols));
  else assert.fail(`castRowInto: ${to} is not a row-wise dtype`);
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
  if (isK(m.dtype)) {
    dequantizeKInto(m.dtype, m.bytes, from, count, out, outAt);
    return;
  }
  if (isLegacy(m.dtype)) {
    dequantizeLegacyInto(m.dtype, m.bytes, from, count, out, outAt);
    return;
  }
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

export function dequantize(m: PackedMatrix | StackedMatrix): Float32Array {
  const out = new Float32Array(m.length);
  if (m.dtype !== "stacked") dequantizeInto(m, 0, m.length, out);
  else {
    let at = 0;
    for (const p of m.parts) {
      if (p instanceof Float32Array) out.set(p, at);
      else dequantizeInto(p, 0, p.length, out, at);
      at += p.length;
    }
  }
  return out;
}

/**
 * Throws when an f16 matrix (or a q8_0 scale) holds inf or NaN: the kernels convert f16 by
 * shifting and rebiasing, exact for every finite value only.
 */
export function assertFinite16(m: PackedMatrix): void {
  if (isK(m.dtype)) {
    assertFiniteK(m.dtype, m.bytes, 0, m.length / QK_K, 0);
    return;
  }
  if (isLegacy(m.dtype)) {
    assertFiniteLegacy(m.dtype, m.bytes, 0, m.length / QK_LEGACY, 0);
    return;
  }
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
