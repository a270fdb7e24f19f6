import assert from "node:assert";
import { type DType, type Matrix, Q8_0_BLOCK_BYTES, QK8_0, dtypeOf } from "./packed.ts";

/**
 * The strip layout the matmul kernels read (kernels/assembly/matmul.ts states it): rows in strips
 * of STRIP_ROWS, the last padded with zero rows; a strip holds group c of all its rows back to back
 * (f32: 4 weights a row; f16: 8; bf16: 8, in the order 0 4 1 5 2 6 3 7; q8_0: one block, the 8
 * scales first), then each row's weights past its last whole group, in order. The bytes per weight
 * are the dtype's own: nothing is widened.
 */
export const STRIP_ROWS = 8;

/** Weights of a row held in whole groups. */
function mainLen(dt: DType, n: number): number {
  if (dt === "f32") return n & ~3;
  if (dt === "q8_0") return n;
  return n & ~7;
}

/** Bytes of one strip of rows of n weights. */
export function stripBytes(dt: DType, n: number): number {
  if (dt === "q8_0") return (n / QK8_0) * STRIP_ROWS * Q8_0_BLOCK_BYTES;
  return STRIP_ROWS * n * (dt === "f32" ? 4 : 2);
}

/** Bytes of `rows` rows of n weights in the strip layout (whole strips). */
export function stripLayoutBytes(dt: DType, rows: number, n: number): number {
  return Math.ceil(rows / STRIP_ROWS) * stripBytes(dt, n);
}

/**
 * `rows` rows of n weights of m, from element `from` (whole q8_0 blocks), into `dst` (the kernel
 * memory's bytes) at `at` (16-byte aligned) in the strip layout; padding rows are written as zeros.
 */
export function packStrips(m: Matrix, from: number, rows: number, n: number, dst: Uint8Array, at: number): void {
  const dt = dtypeOf(m);
  assert(at % 16 === 0, `strip layout at ${at}: not 16-byte aligned`);
  const total = stripLayoutBytes(dt, rows, n);
  dst.fill(0, at, at + total);
  if (m instanceof Float32Array) packF32(m, from, rows, n, new Float32Array(dst.buffer, dst.byteOffset + at, total / 4));
  else if (dt === "q8_0") packQ8(m.bytes, (from / QK8_0) * Q8_0_BLOCK_BYTES, rows, n, dst.subarray(at, at + total));
  else packU16(u16View(m.bytes), from, rows, n, new Uint16Array(dst.buffer, dst.byteOffset + at, total / 2), dt === "bf16");
}

function u16View(b: Uint8Array): Uint16Array {
  // A 16-bit matrix mapped from a file may sit at an odd offset: copy it once, aligned.
  const a = b.byteOffset % 2 === 0 ? b : b.slice();
  return new Uint16Array(a.buffer, a.byteOffset, a.byteLength >> 1);
}

function packF32(src: Float32Array, from: number, rows: number, n: number, out: Float32Array): void {
  const main = mainLen("f32", n);
  const tail = n - main;
  const strip = STRIP_ROWS * n;
  for (let r = 0; r < rows; r++) {
    const s = from + r * n;
    const k = r % STRIP_ROWS;
    const base = Math.floor(r / STRIP_ROWS) * strip;
    for (let c = 0, o = base + k * 4; c < main; c += 4, o += 32) {
      out[o] = src[s + c]!;
      out[o + 1] = src[s + c + 1]!;
      out[o + 2] = src[s + c + 2]!;
      out[o + 3] = src[s + c + 3]!;
    }
    const t = base + STRIP_ROWS * main + k * tail;
    for (let j = 0; j < tail; j++) out[t + j] = src[s + main + j]!;
  }
}

/** `interleave`: each group's weights in the order 0 4 1 5 2 6 3 7 (bf16), else in order (f16). */
function packU16(src: Uint16Array, from: number, rows: number, n: number, out: Uint16Array, interleave: boolean): void {
  const main = mainLen("f16", n);
  const tail = n - main;
  const strip = STRIP_ROWS * n;
  for (let r = 0; r < rows; r++) {
    const s = from + r * n;
    const k = r % STRIP_ROWS;
    const base = Math.floor(r / STRIP_ROWS) * strip;
    for (let c = 0, o = base + k * 8; c < main; c += 8, o += 64) {
      if (interleave) {
        for (let i = 0; i < 4; i++) {
          out[o + 2 * i] = src[s + c + i]!;
          out[o + 2 * i + 1] = src[s + c + 4 + i]!;
        }
      } else for (let i = 0; i < 8; i++) out[o + i] = src[s + c + i]!;
    }
    const t = base + STRIP_ROWS * main + k * tail;
    for (let j = 0; j < tail; j++) out[t + j] = src[s + main + j]!;
  }
}

function packQ8(src: Uint8Array, from: number, rows: number, n: number, out: Uint8Array): void {
  const blocks = n / QK8_0;
  const rowBytes = blocks * Q8_0_BLOCK_BYTES;
  const group = STRIP_ROWS * Q8_0_BLOCK_BYTES;
  for (let r = 0; r < rows; r++) {
    const s = from + r * rowBytes;
    const k = r % STRIP_ROWS;
    const base = Math.floor(r / STRIP_ROWS) * blocks * group;
    for (let c = 0; c < blocks; c++) {
      const b = s + c * Q8_0_BLOCK_BYTES;
      const g = base + c * group;
      out[g + 2 * k] = src[b]!;
      out[g + 2 * k + 1] = src[b + 1]!;
      const q = g + 2 * STRIP_ROWS + QK8_0 * k;
      for (let j = 0; j < QK8_0; j++) out[q + j] = src[b + 2 + j]!;
    }
  }
}
