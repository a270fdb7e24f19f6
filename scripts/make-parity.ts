// Generates parity/kv.wire.v1/: golden v1 envelopes and manifest.json.
//
// Built independently of src/codec on purpose (DataView field by field, a bitwise CRC,
// BigInt FNV, f16 bits by arithmetic), so the codec tests compare two constructions of
// kv-block.md rather than the codec with itself. Deterministic: rerunning rewrites the
// same bytes. Run: npx bun scripts/make-parity.ts
import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const OUT_DIR = join(import.meta.dir, "..", "parity", "kv.wire.v1");

interface Shape {
  block_tokens: number;
  n_layers: number;
  n_kv_heads: number;
  head_dim: number;
}

interface Rec {
  hash: bigint;
  fill: number;
  values: number[]; // P/2 numbers in layout order, exactly representable in f16
}

function fnv1a64(bytes: Uint8Array): bigint {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h;
}

function chainHashes(tokens: number[], B: number): bigint[] {
  const out: bigint[] = [];
  let parent = 0n;
  for (let i = 0; i + B <= tokens.length; i += B) {
    const dv = new DataView(new ArrayBuffer(8 + 4 * B));
    dv.setBigUint64(0, parent, true);
    for (let j = 0; j < B; j++) dv.setUint32(8 + 4 * j, tokens[i + j]!, true);
    let h = fnv1a64(new Uint8Array(dv.buffer));
    if (h === 0n) h = 1n;
    out.push(h);
    parent = h;
  }
  return out;
}

function crc32cBitwise(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

// Normal and zero values only; asserts the value is exact in binary16.
function f16Bits(v: number): number {
  if (v === 0) return Object.is(v, -0) ? 0x8000 : 0;
  const sign = v < 0 ? 0x8000 : 0;
  const a = Math.abs(v);
  const e = Math.floor(Math.log2(a));
  const m = (a / 2 ** e - 1) * 1024;
  if (e < -14 || e > 15 || !Number.isInteger(m)) throw new Error(`${v} is not a normal f16 value`);
  return sign | ((e + 15) << 10) | m;
}

function payloadBytes(s: Shape): number {
  return 2 * s.n_layers * s.n_kv_heads * s.block_tokens * s.head_dim * 2;
}

function build(
  s: Shape,
  recs: Rec[],
  o: { magic?: string; version?: number; dtype?: number; nBlocks?: number; dims?: [number, number, number, number] } = {},
): Uint8Array {
  const P = payloadBytes(s);
  const E = 28 + recs.length * (12 + P) + 4;
  const dv = new DataView(new ArrayBuffer(E));
  const magic = o.magic ?? "TLKV";
  for (let i = 0; i < 4; i++) dv.setUint8(i, magic.charCodeAt(i));
  dv.setUint16(4, o.version ?? 1, true);
  dv.setUint16(6, o.dtype ?? 1, true);
  dv.setUint32(8, o.nBlocks ?? recs.length, true);
  const [B, L, H, D] = o.dims ?? [s.block_tokens, s.n_layers, s.n_kv_heads, s.head_dim];
  dv.setUint32(12, B, true);
  dv.setUint32(16, L, true);
  dv.setUint32(20, H, true);
  dv.setUint32(24, D, true);
  let off = 28;
  for (const r of recs) {
    if (r.values.length !== P / 2) throw new Error(`record has ${r.values.length} values, want ${P / 2}`);
    dv.setBigUint64(off, r.hash, true);
    dv.setUint32(off + 8, r.fill, true);
    off += 12;
    for (const v of r.values) {
      dv.setUint16(off, f16Bits(v), true);
      off += 2;
    }
  }
  const bytes = new Uint8Array(dv.buffer);
  dv.setUint32(off, crc32cBitwise(bytes.subarray(0, off)), true);
  return bytes;
}

function fixCrc(bytes: Uint8Array): Uint8Array {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  dv.setUint32(bytes.length - 4, crc32cBitwise(bytes.subarray(0, bytes.length - 4)), true);
  return bytes;
}

// Deterministic payload: multiples of 1/4 in [-3.5, 3.5], zeros at and past the fill.
function values(s: Shape, blk: number, fill: number): number[] {
  const out: number[] = [];
  for (let l = 0; l < s.n_layers; l++)
    for (let kv = 0; kv < 2; kv++)
      for (let slot = 0; slot < s.block_tokens; slot++)
        for (let h = 0; h < s.n_kv_heads; h++)
          for (let d = 0; d < s.head_dim; d++) out.push(slot < fill ? (((blk * 37 + l * 19 + kv * 11 + slot * 7 + h * 5 + d * 3) % 29) - 14) / 4 : 0);
  return out;
}

function prompt(s: Shape, tokens: number[], drop: Set<number> = new Set()): { recs: Rec[]; chain: bigint[] } {
  const B = s.block_tokens;
  const chain = chainHashes(tokens, B);
  const recs: Rec[] = [];
  for (let b = 0; b * B < tokens.length; b++) {
    const fill = Math.min(B, tokens.length - b * B);
    recs.push({ hash: fill === B && !drop.has(b) ? chain[b]! : 0n, fill, values: values(s, b, fill) });
  }
  return { recs, chain };
}

const hex = (v: bigint | number, w: number) => "0x" + v.toString(16).padStart(w, "0");

interface Case {
  file: string;
  status: "ok" | "corrupt";
  bytes: Uint8Array;
  shape: Shape;
  tokens?: number[];
  chain?: bigint[];
  recs?: Rec[];
  note: string;
  expectShape?: Shape;
  error?: { kind: "Format" | "Version" | "Shape"; rule: number };
}

const cases: Case[] = [];
const ok = (file: string, shape: Shape, tokens: number[], note: string, drop?: Set<number>) => {
  const { recs, chain } = prompt(shape, tokens, drop);
  const c: Case = { file, status: "ok", bytes: build(shape, recs), shape, tokens, chain, recs, note };
  cases.push(c);
  return c;
};
const bad = (file: string, shape: Shape, bytes: Uint8Array, kind: "Format" | "Version" | "Shape", rule: number, note: string, expectShape?: Shape) =>
  cases.push({ file, status: "corrupt", bytes, shape, note, error: { kind, rule }, expectShape });

// The worked example of kv-block.md, values given explicitly.
const ex: Shape = { block_tokens: 2, n_layers: 1, n_kv_heads: 1, head_dim: 2 };
const exRecs: Rec[] = [{ hash: chainHashes([1, 2], 2)[0]!, fill: 2, values: [1, 2, 3, 4, 0.5, -1, 0, 0.25] }];
const exBytes = build(ex, exRecs);
const SPEC_HEX = "544c4b5601000100010000000200000001000000010000000200000066937b02c1b01aa902000000003c00400042004400380" + "0bc000000341c540b4f";
if (Buffer.from(exBytes).toString("hex") !== SPEC_HEX) throw new Error("worked example differs from kv-block.md");
cases.push({
  file: "worked_example.bin",
  status: "ok",
  bytes: exBytes,
  shape: ex,
  tokens: [1, 2],
  chain: chainHashes([1, 2], 2),
  recs: exRecs,
  note: "kv-block.md worked example: B=2 L=1 H=1 D=2, tokens [1,2], K=[[1,2],[3,4]], V=[[0.5,-1],[0,0.25]]",
});

const s4: Shape = { block_tokens: 4, n_layers: 2, n_kv_heads: 1, head_dim: 4 };
const three = ok("three_full_blocks.bin", s4, [5, 9, 2, 7, 11, 3, 8, 1, 4, 6, 10, 12], "3 full blocks, B=4 L=2 H=1 D=4");
const tail = ok("partial_tail.bin", s4, [5, 9, 2, 7, 11, 3, 8, 1, 4], "2 full blocks and a tail of fill 1 (the 9-token transfer example)");
ok("tail_only.bin", s4, [31, 32, 33], "a single partial block of fill 3, zeros past the fill");
ok("hash0_full_block.bin", s4, [5, 9, 2, 7, 11, 3, 8, 1], "2 full blocks; the first written with hash 0 (not owned by the writer)", new Set([0]));
const s22: Shape = { block_tokens: 2, n_layers: 2, n_kv_heads: 2, head_dim: 3 };
ok("l2_h2.bin", s22, [100, 200, 300, 400, 500], "B=2 L=2 H=2 D=3: 2 full blocks and a tail of fill 1");
const s16: Shape = { block_tokens: 16, n_layers: 4, n_kv_heads: 4, head_dim: 32 };
ok(
  "engine_shape.bin",
  s16,
  Array.from({ length: 20 }, (_, i) => (i * 7919) % 32000),
  "the default engine shape B=16 L=4 H=4 D=32: one full block and a tail of 4",
);

const copy = (b: Uint8Array) => new Uint8Array(b);
const setU = (b: Uint8Array, off: number, v: number, size: 2 | 4 | 8) => {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  if (size === 2) dv.setUint16(off, v, true);
  else if (size === 4) dv.setUint32(off, v, true);
  else dv.setBigUint64(off, BigInt(v), true);
  return b;
};
const P4 = payloadBytes(s4);

bad("truncated_short.bin", ex, exBytes.slice(0, 20), "Format", 1, "the first 20 bytes of the worked example");
bad("bad_magic.bin", ex, fixCrc(copy(exBytes).fill(0x58, 0, 1)), "Format", 2, "magic XLKV, CRC recomputed");
bad("bad_magic_bad_crc.bin", ex, copy(exBytes).fill(0x58, 0, 1), "Format", 2, "magic XLKV and a stale CRC: magic is checked first");
{
  const b = copy(three.bytes);
  b[28 + 12 + 5]! ^= 0x10;
  bad("bad_crc.bin", s4, b, "Format", 3, "one payload bit flipped in three_full_blocks, CRC not recomputed");
}
bad("version_2.bin", ex, fixCrc(setU(copy(exBytes), 4, 2, 2)), "Version", 4, "version 2 with a valid CRC");
bad("version_2_bad_crc.bin", ex, setU(copy(exBytes), 4, 2, 2), "Format", 3, "version 2 and a stale CRC: the CRC is checked first");
bad("dtype_2.bin", ex, fixCrc(setU(copy(exBytes), 6, 2, 2)), "Version", 5, "dtype 2 (fp8, format v2) with a valid CRC");
bad(
  "truncated.bin",
  s4,
  fixCrc(three.bytes.slice(0, three.bytes.length - 8)),
  "Format",
  6,
  "three_full_blocks cut by 8 bytes, CRC recomputed over what is left",
);
bad("truncated_bad_crc.bin", s4, three.bytes.slice(0, three.bytes.length - 16), "Format", 3, "three_full_blocks cut by 16 bytes");
bad("n_blocks_mismatch.bin", s4, fixCrc(setU(copy(three.bytes), 8, 4, 4)), "Format", 6, "n_blocks 4 on three records, CRC recomputed");
bad("zero_head_dim.bin", ex, fixCrc(setU(copy(exBytes), 24, 0, 4)), "Format", 6, "head_dim 0, CRC recomputed");
{
  const b = copy(exBytes);
  for (const off of [8, 12, 16, 20, 24]) setU(b, off, 0xffffffff, 4);
  bad("huge_dims.bin", ex, fixCrc(b), "Format", 6, "n_blocks and every dimension 0xffffffff: E overflows 2^53, must not be accepted");
}
bad("shape_mismatch.bin", ex, copy(exBytes), "Shape", 7, "the worked example read by a pool of B=4 L=1 H=1 D=2", { ...ex, block_tokens: 4 });
bad("fill_0.bin", s4, fixCrc(setU(copy(tail.bytes), 28 + 2 * (12 + P4) + 8, 0, 4)), "Format", 8, "partial_tail with the tail's fill 0");
bad("fill_over.bin", s4, fixCrc(setU(copy(tail.bytes), 28 + 2 * (12 + P4) + 8, 5, 4)), "Format", 8, "partial_tail with the tail's fill 5 > B");
{
  const b = copy(tail.bytes);
  new DataView(b.buffer).setBigUint64(28 + 2 * (12 + P4), 0x0123456789abcdefn, true);
  bad("hash_on_partial.bin", s4, fixCrc(b), "Format", 9, "partial_tail with a hash on the tail block");
}
{
  // Rule 8 is applied to every record before rule 9 to any.
  const b = copy(three.bytes);
  setU(b, 28 + 8, 2, 4); // record 0 keeps its hash with fill 2: a rule-9 break
  setU(b, 28 + 2 * (12 + P4) + 8, 0, 4); // record 2 fill 0: a rule-8 break
  bad("fill_0_after_hash_on_partial.bin", s4, fixCrc(b), "Format", 8, "record 0 hash on a partial block, record 2 fill 0: rule 8 wins");
}

mkdirSync(OUT_DIR, { recursive: true });
const shapeJson = (s: Shape) => ({ ...s });
const manifest = {
  format: "kv.wire.v1",
  spec: "docs/kv-block.md",
  generator: "scripts/make-parity.ts",
  payload_formula:
    "value(block, layer, kv, slot, head, dim) = ((block*37 + layer*19 + kv*11 + slot*7 + head*5 + dim*3) % 29 - 14) / 4 for slot < fill, else 0; in layout order (layer, K then V, slot, head, dim); block counts records from 0",
  cases: cases.map((c) => {
    writeFileSync(join(OUT_DIR, c.file), c.bytes);
    const dv = new DataView(c.bytes.buffer, c.bytes.byteOffset, c.bytes.byteLength);
    const base = {
      file: c.file,
      status: c.status,
      note: c.note,
      size: c.bytes.length,
      shape: shapeJson(c.shape),
      sha256: createHash("sha256").update(c.bytes).digest("hex"),
      crc: c.bytes.length >= 4 ? hex(dv.getUint32(c.bytes.length - 4, true), 8) : null,
    };
    if (c.status === "ok") {
      return {
        ...base,
        n_blocks: c.recs!.length,
        tokens: c.tokens,
        prompt_hashes: c.chain!.map((h) => hex(h, 16)),
        hashes: c.recs!.map((r) => hex(r.hash, 16)),
        fills: c.recs!.map((r) => r.fill),
        // The worked example's values are the spec's; the others follow payload_formula.
        ...(c.file === "worked_example.bin" ? { values: c.recs!.map((r) => r.values) } : { payload: "formula" }),
      };
    }
    return {
      ...base,
      ...(c.expectShape ? { expect_shape: shapeJson(c.expectShape) } : {}),
      error: { kind: c.error!.kind, rule: c.error!.rule, code: c.error!.kind === "Format" ? "DATA_LOSS" : "FAILED_PRECONDITION" },
    };
  }),
};
// Arrays of numbers and strings on one line keep the manifest readable.
const json = JSON.stringify(manifest, null, 1).replace(/\[[^[\]{}]*\]/g, (a) => a.replace(/\s*\n\s*/g, " "));
writeFileSync(join(OUT_DIR, "manifest.json"), json + "\n");
console.log(`wrote ${cases.length} envelopes and manifest.json to ${OUT_DIR}`);
