import { quote } from "../../codec/index.ts";
/**
 * A tensor as a file stores it: its dtype, its shape (outermost first, as PyTorch writes it) and
 * a view of its bytes, usually straight into an mmap'd file. Both readers (safetensors, GGUF)
 * produce these; `toFloat32` is the one place stored values become f32, so keeping weights in
 * their stored dtype later means replacing that call, not every loader.
 */
export interface RawTensor {
  name: string;
  dtype: RawDtype;
  /** Outermost first: a (out, in) matrix is [out, in], whatever order the file lists dims in. */
  shape: readonly number[];
  bytes: Uint8Array;
}

export type RawDtype = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q4_k" | "q5_k" | "q6_k";

/** Elements and bytes of one quantization block (1 for plain types). */
export const DTYPE_BLOCK: Readonly<Record<RawDtype, { elems: number; bytes: number }>> = {
  f32: { elems: 1, bytes: 4 },
  f16: { elems: 1, bytes: 2 },
  bf16: { elems: 1, bytes: 2 },
  q8_0: { elems: 32, bytes: 34 },
  q4_0: { elems: 32, bytes: 18 },
  q4_1: { elems: 32, bytes: 20 },
  q5_0: { elems: 32, bytes: 22 },
  q5_1: { elems: 32, bytes: 24 },
  q4_k: { elems: 256, bytes: 144 },
  q5_k: { elems: 256, bytes: 176 },
  q6_k: { elems: 256, bytes: 210 },
};

export function elementCount(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Bytes a tensor of this dtype and element count occupies, or an error naming why it cannot. */
export function byteLengthOf(dtype: RawDtype, elems: number, name: string): number {
  const b = DTYPE_BLOCK[dtype];
  if (elems % b.elems !== 0) throw new Error(`tensor ${quote(name)}: ${elems} elements is not a whole number of ${dtype} blocks of ${b.elems}`);
  return (elems / b.elems) * b.bytes;
}

// f16 bits -> value, exact; shared by every f16 read (also the scales of quantized blocks).
const F16: Float32Array = (() => {
  const bits = new Uint16Array(65536);
  for (let i = 0; i < 65536; i++) bits[i] = i;
  return new Float32Array(new Float16Array(bits.buffer));
})();

/**
 * The tensor's values as f32, in the stored element order (a fresh array, except that an
 * aligned f32 tensor is returned as a view of its bytes). Dequantization follows ggml's
 * definitions: q8_0 is d * q; q4_0 is d * (nibble - 8), low nibbles first, q4_1 d * nibble + m,
 * q5_0/q5_1 the same with a fifth bit from a 32-bit mask; q4_k (q5_k) is
 * d * scale_j * q - dmin * min_j over eight 32-element sub-blocks with 6-bit scales/mins;
 * q6_k is d * scale_j * (q - 32) over sixteen 16-element sub-blocks with int8 scales.
 */
export function toFloat32(t: RawTensor): Float32Array {
  const n = elementCount(t.shape);
  const want = byteLengthOf(t.dtype, n, t.name);
  if (t.bytes.length !== want) throw new Error(`tensor ${quote(t.name)}: ${t.bytes.length} bytes, want ${want} for ${t.dtype} ${quote(t.shape)}`);
  const b = t.bytes;
  if (t.dtype === "f32") {
    if (b.byteOffset % 4 === 0) return new Float32Array(b.buffer, b.byteOffset, n);
    return new Float32Array(b.slice().buffer, 0, n);
  }
  const out = new Float32Array(n);
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  switch (t.dtype) {
    case "f16":
      for (let i = 0; i < n; i++) out[i] = F16[dv.getUint16(2 * i, true)]!;
      break;
    case "bf16":
      {
        const u32 = new Uint32Array(out.buffer);
        for (let i = 0; i < n; i++) u32[i] = dv.getUint16(2 * i, true) << 16;
      }
      break;
    case "q8_0":
      dequantQ8_0(b, dv, out);
      break;
    case "q4_0":
    case "q4_1":
    case "q5_0":
    case "q5_1":
      dequantLegacy(t.dtype, b, dv, out);
      break;
    case "q4_k":
    case "q5_k":
      dequantQ4Q5K(t.dtype === "q5_k", b, dv, out);
      break;
    case "q6_k":
      dequantQ6K(b, dv, out);
      break;
  }
  return out;
}

function dequantQ8_0(b: Uint8Array, dv: DataView, out: Float32Array): void {
  for (let at = 0, o = 0; o < out.length; at += 34, o += 32) {
    const d = F16[dv.getUint16(at, true)]!;
    for (let j = 0; j < 32; j++) out[o + j] = d * ((b[at + 2 + j]! << 24) >> 24);
  }
}

/**
 * The 32-value block types: f16 d, then (q4_1, q5_1) an f16 offset m, then (q5_*) a 32-bit
 * little-endian mask of fifth bits, then 16 bytes of nibbles; value j takes the low nibble of
 * byte j, value j + 16 the high one, and bit j (j + 16) of the mask. The _0 types are signed
 * around 8 (16): d * (q - 8); the _1 types are d * q + m.
 */
function dequantLegacy(dtype: "q4_0" | "q4_1" | "q5_0" | "q5_1", b: Uint8Array, dv: DataView, out: Float32Array): void {
  const { bytes } = DTYPE_BLOCK[dtype];
  const offset = dtype === "q4_1" || dtype === "q5_1";
  const five = dtype === "q5_0" || dtype === "q5_1";
  const bias = offset ? 0 : five ? 16 : 8;
  const qs = 2 + (offset ? 2 : 0) + (five ? 4 : 0);
  for (let at = 0, o = 0; o < out.length; at += bytes, o += 32) {
    const d = F16[dv.getUint16(at, true)]!;
    const m = offset ? F16[dv.getUint16(at + 2, true)]! : 0;
    const qh = five ? dv.getUint32(at + qs - 4, true) : 0;
    for (let j = 0; j < 16; j++) {
      const q = b[at + qs + j]!;
      const q0 = ((q & 0xf) | (((qh >>> j) & 1) << 4)) - bias;
      const q1 = ((q >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - bias;
      out[o + j] = offset ? q0 * d + m : q0 * d;
      out[o + j + 16] = offset ? q1 * d + m : q1 * d;
    }
  }
}

/**
 * Q4_K super-block (256 values, 144 bytes): f16 d, f16 dmin, 12 bytes packing eight 6-bit
 * scales and eight 6-bit mins, 128 bytes of nibbles. Sub-blocks come in pairs sharing 32 bytes:
 * the first takes the low nibbles, the second the high ones. Q5_K (176 bytes) puts 32 bytes of
 * fifth bits before the nibbles: sub-block s takes bit s of each of those bytes.
 */
function dequantQ4Q5K(five: boolean, b: Uint8Array, dv: DataView, out: Float32Array): void {
  const bytes = five ? 176 : 144;
  for (let at = 0, o = 0; o < out.length; at += bytes, o += 256) {
    const d = F16[dv.getUint16(at, true)]!;
    const dmin = F16[dv.getUint16(at + 2, true)]!;
    const sc = at + 4;
    const qh = at + 16;
    const qs = five ? at + 48 : at + 16;
    for (let pair = 0; pair < 4; pair++) {
      const [s1, m1] = scaleMinK4(b, sc, 2 * pair);
      const [s2, m2] = scaleMinK4(b, sc, 2 * pair + 1);
      const d1 = d * s1,
        mm1 = dmin * m1,
        d2 = d * s2,
        mm2 = dmin * m2;
      const q = qs + 32 * pair;
      const y = o + 64 * pair;
      for (let l = 0; l < 32; l++) {
        const h = five ? b[qh + l]! : 0;
        out[y + l] = d1 * ((b[q + l]! & 0xf) | (((h >> (2 * pair)) & 1) << 4)) - mm1;
        out[y + 32 + l] = d2 * ((b[q + l]! >> 4) | (((h >> (2 * pair + 1)) & 1) << 4)) - mm2;
      }
    }
  }
}

/** The j-th 6-bit (scale, min) of a K-quant's 12 packed bytes at `at`. */
function scaleMinK4(b: Uint8Array, at: number, j: number): [number, number] {
  if (j < 4) return [b[at + j]! & 63, b[at + j + 4]! & 63];
  const sc = (b[at + j + 4]! & 0xf) | ((b[at + j - 4]! >> 6) << 4);
  const m = (b[at + j + 4]! >> 4) | ((b[at + j]! >> 6) << 4);
  return [sc, m];
}

/**
 * Q6_K super-block (256 values, 210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit high
 * parts, 16 int8 scales, f16 d. Each 128-value half reads 64 low-nibble bytes and 32 high bytes:
 * value l + 32k (k = 0..3) takes nibble (k & 1 ? byte l+32 : byte l) >> (k >= 2 ? 4 : 0) and
 * high bits 2k..2k+1 of byte l, scaled by the half's scale 2k + l/16.
 */
function dequantQ6K(b: Uint8Array, dv: DataView, out: Float32Array): void {
  for (let at = 0, o = 0; o < out.length; at += 210, o += 256) {
    const d = F16[dv.getUint16(at + 208, true)]!;
    for (let half = 0; half < 2; half++) {
      const ql = at + 64 * half;
      const qh = at + 128 + 32 * half;
      const sc = at + 192 + 8 * half;
      const y = o + 128 * half;
      for (let l = 0; l < 32; l++) {
        const h = b[qh + l]!;
        const is = l >> 4;
        for (let k = 0; k < 4; k++) {
          const lowByte = b[ql + l + (k & 1 ? 32 : 0)]!;
          const q = ((k >= 2 ? lowByte >> 4 : lowByte & 0xf) | (((h >> (2 * k)) & 3) << 4)) - 32;
          out[y + l + 32 * k] = d * ((b[sc + is + 2 * k]! << 24) >> 24) * q;
        }
      }
    }
  }
}
