import type { FileBytes } from "../compute/index.ts";
import { byteLengthOf, elementCount, type RawDtype, type RawTensor } from "./raw-tensor.ts";
import { quote } from "../../codec/index.ts";

/** safetensors' own reader refuses headers above 100 MB; so do we, before parsing any of it. */
export const MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024;

const DTYPES: Readonly<Record<string, RawDtype>> = { F32: "f32", F16: "f16", BF16: "bf16" };

/**
 * The tensors of one .safetensors file: an 8-byte little-endian header length, a JSON header
 * mapping names to { dtype, shape, data_offsets } relative to the data section, then the data.
 * Every entry is checked before any view is made: offsets inside the data, lengths matching
 * dtype x shape, no two tensors overlapping. Tensors are views into `bytes`.
 */
export function parseSafetensors(bytes: FileBytes, file: string): Map<string, RawTensor> {
  if (bytes.length < 8) throw new Error(`safetensors ${file}: ${bytes.length} bytes, shorter than the 8-byte header length`);
  // The header from the file's start; each tensor a view of its own range (a shard may be past one mapping).
  const head = bytes.subarray(0, Math.min(bytes.length, 8 + MAX_SAFETENSORS_HEADER));
  const dv = new DataView(head.buffer, head.byteOffset, head.byteLength);
  const n = dv.getBigUint64(0, true);
  if (n > BigInt(Math.min(MAX_SAFETENSORS_HEADER, bytes.length - 8))) {
    throw new Error(
      `safetensors ${file}: header length ${n} exceeds ${bytes.length < MAX_SAFETENSORS_HEADER + 8 ? `the file's ${bytes.length - 8} bytes after it` : `the ${MAX_SAFETENSORS_HEADER}-byte limit`}`,
    );
  }
  const headerLen = Number(n);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(head.subarray(8, 8 + headerLen)));
  } catch (e) {
    throw new Error(`safetensors ${file}: header is not valid JSON (${e instanceof Error ? e.message : String(e)})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) throw new Error(`safetensors ${file}: header is not a JSON object`);
  const data = { bytes, start: 8 + headerLen, length: bytes.length - 8 - headerLen };
  const out = new Map<string, RawTensor>();
  const spans: [number, number, string][] = [];
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") continue;
    const { tensor, from, to } = tensorOf(name, entry, data, file);
    out.set(name, tensor);
    spans.push([from, to, name]);
  }
  spans.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < spans.length; i++) {
    if (spans[i]![0] < spans[i - 1]![1]) throw new Error(`safetensors ${file}: tensors ${spans[i - 1]![2]} and ${spans[i]![2]} overlap`);
  }
  return out;
}

/** The data section: `length` bytes of the file from `start`. */
interface DataSection {
  bytes: FileBytes;
  start: number;
  length: number;
}

function tensorOf(name: string, entry: unknown, data: DataSection, file: string): { tensor: RawTensor; from: number; to: number } {
  const where = `safetensors ${file}: tensor ${quote(name)}`;
  if (typeof entry !== "object" || entry === null) throw new Error(`${where}: entry is not an object`);
  const { dtype, shape, data_offsets: offs } = entry as Record<string, unknown>;
  if (typeof dtype !== "string") throw new Error(`${where}: dtype missing`);
  const dt = DTYPES[dtype];
  if (dt === undefined) throw new Error(`${where} has dtype ${quote(dtype)}: supported ${Object.keys(DTYPES).join(", ")}`);
  if (!Array.isArray(shape) || shape.length > 8 || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new Error(`${where}: shape ${quote(shape)} is not a list of at most 8 non-negative integers`);
  }
  if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0) || offs[0] > offs[1] || offs[1] > data.length) {
    throw new Error(`${where}: data_offsets ${quote(offs)} outside the ${data.length}-byte data section`);
  }
  const elems = elementCount(shape as number[]);
  const want = byteLengthOf(dt, elems, name);
  if (offs[1] - offs[0] !== want) throw new Error(`${where}: ${offs[1] - offs[0]} bytes, want ${want} for ${dtype} ${quote(shape)}`);
  const tensor = { name, dtype: dt, shape: shape as number[], bytes: data.bytes.subarray(data.start + offs[0], data.start + offs[1]) };
  return { tensor, from: offs[0], to: offs[1] };
}
