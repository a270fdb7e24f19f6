import assert from "node:assert";
import { kGroupBytes, packKStrip, readKStripRow } from "./k-quant-strips.ts";
import { assertFiniteK, isK, QK_K } from "./k-quants.ts";
import { assertFiniteLegacy, isLegacy, QK_LEGACY } from "./legacy-quants.ts";
import { legacyGroupBytes, packLegacyStrip, readLegacyStripRow } from "./legacy-strips.ts";
import { copyBytes } from "./mapped-file.ts";
import { f16Unshift } from "./f16-bits.ts";
import { blockElems, type DType, dtypeOf, f16Values, matrixBytes, type PackedMatrix, Q8_0_BLOCK_BYTES, QK8_0, type SimpleMatrix } from "./packed.ts";

/**
 * The strip layout the matmul kernels read (kernels/assembly/matmul.ts states it): rows in strips
 * of STRIP_ROWS, the last padded with zero rows; a strip holds group c of all its rows back to back
 * (f32: 4 weights a row; f16 and bf16: 8, in the order 0 4 1 5 2 6 3 7; q8_0: one block, the 8
 * scales first, the int8 in pairs of four rows: q8Slot), then each row's weights past its last
 * whole group, in order; q4_k and q6_k take a group per 256-weight super-block (k-quant-strips.ts).
 * The bytes per weight are the dtype's own (q4_k's 6-bit scales unpacked to bytes): nothing is
 * widened.
 */
export const STRIP_ROWS = 8;

/** Weights of a row held in whole groups. */
function mainLen(dt: DType, n: number): number {
  if (dt === "f32") return n & ~3;
  if (dt === "q8_0" || isK(dt) || isLegacy(dt)) return n;
  return n & ~7;
}

/** Bytes of one strip of rows of n weights. */
export function stripBytes(dt: DType, n: number): number {
  if (dt === "q8_0") return (n / QK8_0) * STRIP_ROWS * Q8_0_BLOCK_BYTES;
  if (isK(dt)) return (n / QK_K) * kGroupBytes(dt);
  if (isLegacy(dt)) return (n / QK_LEGACY) * legacyGroupBytes(dt);
  return STRIP_ROWS * n * (dt === "f32" ? 4 : 2);
}

/** Bytes of `rows` rows of n weights in the strip layout (whole strips). */
export function stripLayoutBytes(dt: DType, rows: number, n: number): number {
  return Math.ceil(rows / STRIP_ROWS) * stripBytes(dt, n);
}

/**
 * The kernels at hand, to place a matrix's rows (16-bit, q8_0, K-quant or legacy): `rows` rows of
 * n weights (src a view of them as the file holds them, read with copyBytes) placed at `at` by
 * the kernels on every thread (kernels/assembly/place-strips.ts). Returns the index of the first
 * block with an inf or NaN scale (f16: the first such weight), else -1; null for a dtype they do
 * not place (placed here).
 */
export interface KernelPlace {
  staged(dt: DType, src: Uint8Array, rows: number, n: number, at: number): number | null;
}

/**
 * `rows` rows of n weights of m, from element `from` (whole blocks), into `dst` (the kernel
 * memory's bytes) at `at` (16-byte aligned) in the strip layout; padding rows are written as
 * zeros. The rows are read a strip at a time with copyBytes (a mapped file's pages are never
 * touched), and f16 weights and f16 scales are checked finite on the way (the kernels widen f16
 * exactly for finite values only). With `place` (the kernels at hand), the rows are read many
 * strips at a time and placed by the kernels on every thread: the same bytes, many times faster.
 */
export function packStrips(m: SimpleMatrix, from: number, rows: number, n: number, dst: Uint8Array, at: number, place?: KernelPlace): void {
  const dt = dtypeOf(m);
  assert(at % 16 === 0, `strip layout at ${at}: not 16-byte aligned`);
  const total = stripLayoutBytes(dt, rows, n);
  const rowBytes = matrixBytes(dt, n);
  const first = matrixBytes(dt, from);
  if (place !== undefined && !(m instanceof Float32Array)) {
    const bad = place.staged(dt, m.bytes.subarray(first, first + rows * rowBytes), rows, n, at);
    if (bad !== null && bad >= 0) throw new Error(badMessage(m, first, bad));
    if (bad !== null) return;
  }
  dst.fill(0, at, at + total);
  const stage = new ArrayBuffer(STRIP_ROWS * rowBytes);
  const stageU8 = new Uint8Array(stage);
  const sb = stripBytes(dt, n);
  for (let r = 0; r < rows; r += STRIP_ROWS) {
    const k = Math.min(STRIP_ROWS, rows - r);
    if (m instanceof Float32Array) copyBytes(stageU8, 0, new Uint8Array(m.buffer, m.byteOffset + first + r * rowBytes, k * rowBytes));
    else copyBytes(stageU8, 0, m.bytes.subarray(first + r * rowBytes, first + (r + k) * rowBytes));
    const o = at + (r / STRIP_ROWS) * sb;
    if (dt === "f32") packF32(new Float32Array(stage), k, n, new Float32Array(dst.buffer, dst.byteOffset + o, sb / 4));
    else if (isLegacy(dt)) {
      assertFiniteLegacy(dt, stageU8, 0, (k * n) / QK_LEGACY, from / QK_LEGACY + (r * n) / QK_LEGACY);
      packLegacyStrip(dt, stageU8, k, n, dst.subarray(o, o + sb));
    } else if (isK(dt)) {
      assertFiniteK(dt, stageU8, 0, (k * n) / QK_K, from / QK_K + (r * n) / QK_K);
      packKStrip(dt, stageU8, k, n, dst.subarray(o, o + sb));
    } else if (dt === "q8_0") {
      assertFiniteScales(stageU8, k, n, from / QK8_0 + (r * n) / QK8_0);
      packQ8(stageU8, k, n, dst.subarray(o, o + sb));
    } else {
      const u16 = new Uint16Array(stage);
      if (dt === "f16") assertFiniteF16(u16, k * n, from + r * n);
      packU16(u16, k, n, new Uint16Array(dst.buffer, dst.byteOffset + o, sb / 2));
    }
  }
}

/** What packStrips throws for block (f16: weight) `bad` of m's rows from byte `first`, as the plain checks below word it. */
function badMessage(m: PackedMatrix, first: number, bad: number): string {
  const dt = m.dtype;
  const bb = matrixBytes(dt, blockElems(dt));
  // q6_k's d is its last 2 bytes; the others' d comes first, then dmin or m where the block has one.
  const o = first + bad * bb + (dt === "q6_k" ? bb - 2 : 0);
  const h = new Uint8Array(4);
  copyBytes(h, 0, m.bytes.subarray(o, o + Math.min(4, bb)));
  const d = h[0]! | (h[1]! << 8);
  if (dt === "f16") return `f16 weight ${first / 2 + bad} is inf or NaN (0x${d.toString(16)})`;
  const two = dt === "q4_k" || dt === "q5_k" || dt === "q4_1" || dt === "q5_1";
  const bits = (d & 0x7c00) === 0x7c00 || !two ? d : h[2]! | (h[3]! << 8);
  return `${dt} block ${first / bb + bad} has an inf or NaN scale (0x${bits.toString(16)})`;
}

function assertFiniteF16(u16: Uint16Array, count: number, firstIndex: number): void {
  for (let i = 0; i < count; i++) {
    if ((u16[i]! & 0x7c00) === 0x7c00) throw new Error(`f16 weight ${firstIndex + i} is inf or NaN (0x${u16[i]!.toString(16)})`);
  }
}

function assertFiniteScales(b: Uint8Array, rows: number, n: number, firstBlock: number): void {
  for (let i = 0, blocks = (rows * n) / QK8_0; i < blocks; i++) {
    const h = b[i * Q8_0_BLOCK_BYTES]! | (b[i * Q8_0_BLOCK_BYTES + 1]! << 8);
    if ((h & 0x7c00) === 0x7c00) throw new Error(`q8_0 block ${firstBlock + i} has an inf or NaN scale (0x${h.toString(16)})`);
  }
}

/** Up to STRIP_ROWS rows of src (rows of n, from its start) into one strip at out. */
function packF32(src: Float32Array, rows: number, n: number, out: Float32Array): void {
  const main = mainLen("f32", n);
  const tail = n - main;
  for (let k = 0; k < rows; k++) {
    const s = k * n;
    for (let c = 0, o = k * 4; c < main; c += 4, o += 32) {
      out[o] = src[s + c]!;
      out[o + 1] = src[s + c + 1]!;
      out[o + 2] = src[s + c + 2]!;
      out[o + 3] = src[s + c + 3]!;
    }
    const t = STRIP_ROWS * main + k * tail;
    for (let j = 0; j < tail; j++) out[t + j] = src[s + main + j]!;
  }
}

/** Each group's weights in the order 0 4 1 5 2 6 3 7 (weight l in the low half of 32-bit lane l, l + 4 in the high). */
function packU16(src: Uint16Array, rows: number, n: number, out: Uint16Array): void {
  const main = mainLen("f16", n);
  const tail = n - main;
  for (let k = 0; k < rows; k++) {
    const s = k * n;
    for (let c = 0, o = k * 8; c < main; c += 8, o += 64) {
      for (let i = 0; i < 4; i++) {
        out[o + 2 * i] = src[s + c + i]!;
        out[o + 2 * i + 1] = src[s + c + 4 + i]!;
      }
    }
    const t = STRIP_ROWS * main + k * tail;
    for (let j = 0; j < tail; j++) out[t + j] = src[s + main + j]!;
  }
}

/**
 * Where weight j of row k sits in a q8_0 group: after the 8 scales, rows 0..3 then rows 4..7,
 * each four in pairs of weights (j, j + 1) row after row, so 8 bytes hold one pair of four rows
 * (which one i32x4.dot_i16x8_s takes against the pair of x: kernels/assembly/q8.ts).
 */
export function q8Slot(k: number, j: number): number {
  return 2 * STRIP_ROWS + (k >> 2) * 128 + (j >> 1) * 8 + (k & 3) * 2 + (j & 1);
}

function packQ8(src: Uint8Array, rows: number, n: number, out: Uint8Array): void {
  const blocks = n / QK8_0;
  const rowBytes = blocks * Q8_0_BLOCK_BYTES;
  const group = STRIP_ROWS * Q8_0_BLOCK_BYTES;
  for (let k = 0; k < rows; k++) {
    for (let c = 0; c < blocks; c++) {
      const b = k * rowBytes + c * Q8_0_BLOCK_BYTES;
      const g = c * group;
      out[g + 2 * k] = src[b]!;
      out[g + 2 * k + 1] = src[b + 1]!;
      for (let j = 0; j < QK8_0; j++) out[g + q8Slot(k, j)] = src[b + 2 + j]!;
    }
  }
}

/** Typed views of the kernel memory that readStripRow reads through. */
export interface MemoryViews {
  f32: Float32Array;
  u8: Uint8Array;
  u16: Uint16Array;
  i8: Int8Array;
}

/**
 * Elements from .. from + count of one row (row floor(from / n)) of the matrix whose strips are
 * at byte `at` of the memory, made f32 (exactly) into out at outAt: the embedding's lookup when
 * the classifier shares it. `shifted`: f16 weights placed in the shifted coding (f16-bits.ts'
 * f16Shift).
 */
export function readStripRow(
  dt: DType,
  mem: MemoryViews,
  at: number,
  n: number,
  from: number,
  count: number,
  out: Float32Array,
  outAt: number,
  shifted = false,
): void {
  const r = Math.floor(from / n);
  const j0 = from - r * n;
  if (j0 + count > n) assert.fail(`strip row read ${from}+${count} crosses a row of ${n}`);
  const base = at + Math.floor(r / STRIP_ROWS) * stripBytes(dt, n);
  const k = r % STRIP_ROWS;
  const main = mainLen(dt, n);
  if (isLegacy(dt)) {
    readLegacyStripRow(dt, mem.u8, base, k, j0, count, out, outAt);
    return;
  }
  if (isK(dt)) {
    readKStripRow(dt, mem.u8, base, k, j0, count, out, outAt);
    return;
  }
  if (dt === "q8_0") {
    const lut = f16Values();
    for (let j = j0; j < j0 + count; j++) {
      const g = base + (j >> 5) * STRIP_ROWS * Q8_0_BLOCK_BYTES;
      out[outAt + j - j0] = Math.fround(lut[mem.u16[(g + 2 * k) / 2]!]! * mem.i8[g + q8Slot(k, j & 31)]!);
    }
    return;
  }
  const es = dt === "f32" ? 4 : 2;
  const gl = dt === "f32" ? 4 : 8;
  const half = dt === "f16";
  for (let j = j0; j < j0 + count; j++) {
    let p: number;
    if (j < main) {
      const i = j % gl;
      const slot = dt === "f32" ? i : i < 4 ? 2 * i : 2 * (i - 4) + 1;
      p = base + Math.floor(j / gl) * 128 + k * 16 + slot * es;
    } else p = base + STRIP_ROWS * main * es + k * (n - main) * es + (j - main) * es;
    let v: number;
    if (dt === "f32") v = mem.f32[p / 4]!;
    else if (half) v = f16Value(shifted ? f16Unshift(mem.u16[p / 2]!) : mem.u16[p / 2]!);
    else {
      bf16Bits[0] = mem.u16[p / 2]! << 16;
      v = bf16Value[0]!;
    }
    out[outAt + j - j0] = v;
  }
}

/** 2^(e - 25) for each f16 exponent e (0 as 1: subnormals scale by 2^-24). */
const F16_SCALE = Float64Array.from({ length: 32 }, (_, e) => 2 ** (Math.max(e, 1) - 25));

/**
 * The finite f16 pattern h as a number, exactly (placed weights are checked finite). Arithmetic
 * rather than f16Values' table: a row read after the weights streamed through (the embedding,
 * each token) would miss its 256 KB at random.
 */
function f16Value(h: number): number {
  const e = (h >> 10) & 0x1f;
  const v = ((e === 0 ? 0 : 1024) + (h & 0x3ff)) * F16_SCALE[e]!;
  return h & 0x8000 ? -v : v;
}

const bf16Value = new Float32Array(1);
const bf16Bits = new Uint32Array(bf16Value.buffer);
