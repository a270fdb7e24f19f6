import type { FileBytes } from "../compute/index.ts";
import { byteLengthOf, DTYPE_BLOCK, elementCount, type RawDtype, type RawTensor } from "./raw-tensor.ts";
import { quote } from "../../codec/index.ts";

/** "GGUF" read as a little-endian uint32. */
export const GGUF_MAGIC = 0x46554747;
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** A metadata value: numbers (64-bit integers as bigint only when past 2^53), strings, bools, arrays. */
export type GgufValue = number | bigint | boolean | string | GgufValue[];

/** One tensor's description; `type` is ggml's type number, kept even when unsupported so errors can name it. */
export interface GgufTensorInfo {
  name: string;
  /** Outermost first (GGUF lists ne[0], the contiguous dimension, first; this is reversed). */
  shape: number[];
  type: number;
  /** Bytes from the start of the data section. */
  offset: number;
}

export interface GgufFile {
  version: number;
  meta: Map<string, GgufValue>;
  tensors: GgufTensorInfo[];
  alignment: number;
  /** The file offset of the (aligned) data section. */
  dataOffset: number;
}

/** ggml's type numbers, by name, for the types this engine reads and those it names in errors. */
const GGML_TYPES: Readonly<Record<number, string>> = {
  0: "F32",
  1: "F16",
  2: "Q4_0",
  3: "Q4_1",
  6: "Q5_0",
  7: "Q5_1",
  8: "Q8_0",
  9: "Q8_1",
  10: "Q2_K",
  11: "Q3_K",
  12: "Q4_K",
  13: "Q5_K",
  14: "Q6_K",
  15: "Q8_K",
  16: "IQ2_XXS",
  17: "IQ2_XS",
  18: "IQ3_XXS",
  19: "IQ1_S",
  20: "IQ4_NL",
  21: "IQ3_S",
  22: "IQ2_S",
  23: "IQ4_XS",
  24: "I8",
  25: "I16",
  26: "I32",
  27: "I64",
  28: "F64",
  29: "IQ1_M",
  30: "BF16",
};
const READABLE: Readonly<Record<number, RawDtype>> = {
  0: "f32",
  1: "f16",
  2: "q4_0",
  3: "q4_1",
  6: "q5_0",
  7: "q5_1",
  8: "q8_0",
  12: "q4_k",
  13: "q5_k",
  14: "q6_k",
  30: "bf16",
};
export const GGUF_READABLE_TYPES = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

export function ggmlTypeName(type: number): string {
  return GGML_TYPES[type] ?? `type ${type}`;
}

/** The dtype a tensor of ggml `type` is read as, or null when this engine cannot read it. */
export function ggmlDtype(type: number): RawDtype | null {
  return READABLE[type] ?? null;
}

// Bounds: every count is checked against the bytes left before anything is allocated for it.
const MAX_DIMS = 8;

/** A cursor over hostile bytes: every read checks it stays inside the buffer. */
class Reader {
  at = 0;
  private readonly dv: DataView;
  private readonly utf8 = new TextDecoder("utf-8", { fatal: true });
  constructor(
    readonly bytes: Uint8Array,
    readonly file: string,
  ) {
    this.dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  need(n: number, what: string): void {
    if (this.at + n > this.bytes.length)
      throw new Error(`GGUF ${this.file}: truncated reading ${what} at byte ${this.at} (file is ${this.bytes.length} bytes)`);
  }
  u8(): number {
    this.need(1, "u8");
    return this.dv.getUint8(this.at++);
  }
  i8(): number {
    this.need(1, "i8");
    return this.dv.getInt8(this.at++);
  }
  u16(): number {
    this.need(2, "u16");
    const v = this.dv.getUint16(this.at, true);
    this.at += 2;
    return v;
  }
  i16(): number {
    this.need(2, "i16");
    const v = this.dv.getInt16(this.at, true);
    this.at += 2;
    return v;
  }
  u32(): number {
    this.need(4, "u32");
    const v = this.dv.getUint32(this.at, true);
    this.at += 4;
    return v;
  }
  i32(): number {
    this.need(4, "i32");
    const v = this.dv.getInt32(this.at, true);
    this.at += 4;
    return v;
  }
  f32(): number {
    this.need(4, "f32");
    const v = this.dv.getFloat32(this.at, true);
    this.at += 4;
    return v;
  }
  f64(): number {
    this.need(8, "f64");
    const v = this.dv.getFloat64(this.at, true);
    this.at += 8;
    return v;
  }
  u64(): number | bigint {
    this.need(8, "u64");
    const v = this.dv.getBigUint64(this.at, true);
    this.at += 8;
    return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
  i64(): number | bigint {
    this.need(8, "i64");
    const v = this.dv.getBigInt64(this.at, true);
    this.at += 8;
    return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
  }
  /** A u64 that must be a count or offset this file can hold. */
  size(what: string, max: number): number {
    const v = this.u64();
    if (typeof v !== "number" || v > max) throw new Error(`GGUF ${this.file}: ${what} ${v} exceeds ${max}`);
    return v;
  }
  str(what: string): string {
    const n = this.size(`${what} length`, this.bytes.length - this.at - 8);
    this.need(n, what);
    let s: string;
    try {
      s = this.utf8.decode(this.bytes.subarray(this.at, this.at + n));
    } catch {
      throw new Error(`GGUF ${this.file}: ${what} at byte ${this.at} is not valid UTF-8`);
    }
    this.at += n;
    return s;
  }
}

/**
 * Reads a GGUF v2/v3 header: metadata, tensor infos, alignment and data offset. Tensor bytes
 * are not touched; `ggufTensor` makes a view of one. Every tensor's extent is checked to lie
 * inside the file. `bytes` holds the header (the file's start, or all of it); `fileLength` is
 * the whole file's, when `bytes` is only its first window (a file past one mapping).
 */
export function parseGguf(bytes: Uint8Array, file: string, fileLength = bytes.length): GgufFile {
  const r = new Reader(bytes, file);
  if (bytes.length < 24 || r.u32() !== GGUF_MAGIC) throw new Error(`GGUF ${file}: no GGUF magic`);
  const version = r.u32();
  if (version !== 2 && version !== 3) throw new Error(`GGUF ${file}: version ${version}; versions 2 and 3 are supported`);
  const nTensors = r.size("tensor count", bytes.length / 24);
  const nKv = r.size("metadata count", bytes.length / 12);
  const meta = new Map<string, GgufValue>();
  for (let i = 0; i < nKv; i++) {
    const key = r.str("metadata key");
    meta.set(key, readValue(r, r.u32(), quote(key), 0));
  }
  const tensors: GgufTensorInfo[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = r.str("tensor name");
    const quoted = quote(name);
    const nDims = r.u32();
    if (nDims < 1 || nDims > MAX_DIMS) throw new Error(`GGUF ${file}: tensor ${quoted} has ${nDims} dimensions, want 1..${MAX_DIMS}`);
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) dims.push(r.size(`tensor ${quoted} dimension`, Number.MAX_SAFE_INTEGER));
    const type = r.u32();
    const offset = r.size(`tensor ${quoted} offset`, fileLength);
    tensors.push({ name, shape: dims.reverse(), type, offset });
  }
  const align = meta.get("general.alignment") ?? GGUF_DEFAULT_ALIGNMENT;
  if (typeof align !== "number" || !Number.isInteger(align) || align < 1 || align > 65536 || (align & (align - 1)) !== 0) {
    throw new Error(`GGUF ${file}: general.alignment ${quote(align)} is not a power of two up to 65536`);
  }
  const dataOffset = Math.ceil(r.at / align) * align;
  for (const t of tensors) {
    if (t.offset % align !== 0) throw new Error(`GGUF ${file}: tensor ${quote(t.name)} offset ${t.offset} is not a multiple of the alignment ${align}`);
    const dt = ggmlDtype(t.type);
    if (dt === null) continue; // unreadable types are refused by whoever needs them, by name
    // ggml quantizes each row on its own: a row must be whole blocks.
    const rowLen = t.shape[t.shape.length - 1]!;
    if (rowLen % DTYPE_BLOCK[dt].elems !== 0)
      throw new Error(`GGUF ${file}: tensor ${quote(t.name)} rows of ${rowLen} are not whole ${ggmlTypeName(t.type)} blocks of ${DTYPE_BLOCK[dt].elems}`);
    const end = dataOffset + t.offset + byteLengthOf(dt, elementCount(t.shape), t.name);
    if (end > fileLength) throw new Error(`GGUF ${file}: tensor ${quote(t.name)} ends at byte ${end}, past the file's ${fileLength}`);
  }
  return { version, meta, tensors, alignment: align, dataOffset };
}

/** `key`: the metadata key as messages quote it (quote()). */
function readValue(r: Reader, type: number, key: string, depth: number): GgufValue {
  switch (type) {
    case 0:
      return r.u8();
    case 1:
      return r.i8();
    case 2:
      return r.u16();
    case 3:
      return r.i16();
    case 4:
      return r.u32();
    case 5:
      return r.i32();
    case 6:
      return r.f32();
    case 7: {
      const b = r.u8();
      if (b > 1) throw new Error(`GGUF ${r.file}: metadata ${key} bool is ${b}`);
      return b === 1;
    }
    case 8:
      return r.str(`metadata ${key}`);
    case 9: {
      if (depth > 2) throw new Error(`GGUF ${r.file}: metadata ${key} nests arrays deeper than 3`);
      const elemType = r.u32();
      // Every element takes at least one byte, so a count past the bytes left is a lie.
      const n = r.size(`metadata ${key} array length`, r.bytes.length - r.at);
      const out: GgufValue[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = readValue(r, elemType, key, depth + 1);
      return out;
    }
    case 10:
      return r.u64();
    case 11:
      return r.i64();
    case 12:
      return r.f64();
    default:
      throw new Error(`GGUF ${r.file}: metadata ${key} has unknown value type ${type}`);
  }
}

/** A view of one readable tensor's bytes (parseGguf has checked it lies inside the file). */
export function ggufTensor(bytes: FileBytes, g: GgufFile, info: GgufTensorInfo): RawTensor {
  const dtype = ggmlDtype(info.type);
  if (dtype === null) throw new Error(`tensor ${quote(info.name)} has type ${ggmlTypeName(info.type)}: supported ${GGUF_READABLE_TYPES}`);
  const start = g.dataOffset + info.offset;
  const len = byteLengthOf(dtype, elementCount(info.shape), info.name);
  return { name: info.name, dtype, shape: info.shape, bytes: bytes.subarray(start, start + len) };
}
