import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  blockPayloadBytes,
  crc32c,
  grpcCodeNameOf,
  grpcCodeOf,
  promptHashes,
  readEnvelope,
  writeEnvelope,
  type EnvelopeRecord,
  type KvShape,
} from "../../src/codec/index.ts";
import { elemOffset, refusal } from "./support.ts";

const DIR = join(import.meta.dir, "..", "..", "parity", "kv.wire.v1");

interface ShapeJson {
  block_tokens: number;
  n_layers: number;
  n_kv_heads: number;
  head_dim: number;
}
interface CaseJson {
  file: string;
  status: "ok" | "corrupt";
  size: number;
  shape: ShapeJson;
  sha256: string;
  crc: string | null;
  n_blocks?: number;
  tokens?: number[];
  prompt_hashes?: string[];
  hashes?: string[];
  fills?: number[];
  values?: number[][];
  payload?: "formula";
  expect_shape?: ShapeJson;
  error?: { kind: "Format" | "Version" | "Shape"; rule: number; code: "DATA_LOSS" | "FAILED_PRECONDITION" };
}

const manifest = JSON.parse(readFileSync(join(DIR, "manifest.json"), "utf8")) as { format: string; cases: CaseJson[] };
const shapeOf = (s: ShapeJson): KvShape => ({ blockTokens: s.block_tokens, nLayers: s.n_layers, nKvHeads: s.n_kv_heads, headDim: s.head_dim });
const hex = (v: bigint) => "0x" + v.toString(16).padStart(16, "0");

// The manifest's payload_formula, written the way the pool fills a block: through
// Float16Array and the pool's offset arithmetic.
function formulaBlock(s: KvShape, blk: number, fill: number): Float16Array {
  const a = new Float16Array(blockPayloadBytes(s) / 2);
  for (let l = 0; l < s.nLayers; l++)
    for (const kv of [0, 1] as const)
      for (let slot = 0; slot < fill; slot++)
        for (let h = 0; h < s.nKvHeads; h++) {
          const at = elemOffset(s, l, kv, slot, h);
          for (let d = 0; d < s.headDim; d++) a[at + d] = (((blk * 37 + l * 19 + kv * 11 + slot * 7 + h * 5 + d * 3) % 29) - 14) / 4;
        }
  return a;
}

describe("parity kv.wire.v1", () => {
  test("writer matches the golden blobs", () => {
    expect(manifest.format).toBe("kv.wire.v1");
    const good = manifest.cases.filter((c) => c.status === "ok");
    const bad = manifest.cases.filter((c) => c.status === "corrupt");
    expect(good.length).toBeGreaterThanOrEqual(5);
    expect(bad.length).toBeGreaterThanOrEqual(7);

    for (const c of manifest.cases) {
      const bytes = new Uint8Array(readFileSync(join(DIR, c.file)));
      expect({ file: c.file, size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") }).toEqual({
        file: c.file,
        size: c.size,
        sha256: c.sha256,
      });
    }

    for (const c of good) {
      const s = shapeOf(c.shape);
      const golden = new Uint8Array(readFileSync(join(DIR, c.file)));
      // Hashes: the chain of the prompt's tokens; records carry them, or 0 (tail, not owned).
      expect(promptHashes(c.tokens!, s.blockTokens).map(hex)).toEqual(c.prompt_hashes!);
      const records: EnvelopeRecord[] = c.fills!.map((fill, i) => {
        const vals = c.values ? Float16Array.from(c.values[i]!) : formulaBlock(s, i, fill);
        return { hash: BigInt(c.hashes![i]!), nTokens: fill, payload: new Uint8Array(vals.buffer) };
      });
      expect(records.length).toBe(c.n_blocks!);
      const written = writeEnvelope({ version: 1, dtype: 1, nBlocks: records.length, ...s }, records);
      if (Buffer.compare(Buffer.from(written), Buffer.from(golden)) !== 0) {
        const at = written.findIndex((b, i) => b !== golden[i]);
        throw new Error(`${c.file}: writer differs from the golden at byte ${at} (lengths ${written.length}, ${golden.length})`);
      }
      expect(
        "0x" +
          crc32c(golden.subarray(0, golden.length - 4))
            .toString(16)
            .padStart(8, "0"),
      ).toBe(c.crc!);

      const back = readEnvelope(golden, s);
      expect(back.header).toEqual({ version: 1, dtype: 1, nBlocks: c.n_blocks!, ...s });
      expect(back.records.map((r) => hex(r.hash))).toEqual(c.hashes!);
      expect(back.records.map((r) => r.nTokens)).toEqual(c.fills!);
      back.records.forEach((r, i) => expect(Buffer.from(r.payload).equals(Buffer.from(records[i]!.payload))).toBe(true));
    }

    for (const c of bad) {
      const bytes = new Uint8Array(readFileSync(join(DIR, c.file)));
      const e = refusal(() => readEnvelope(bytes, c.expect_shape ? shapeOf(c.expect_shape) : undefined));
      expect({ file: c.file, kind: e.kind, rule: e.rule, code: grpcCodeNameOf(e.kind) }).toEqual({ file: c.file, ...c.error! });
      expect(e.code).toBe(grpcCodeOf(c.error!.kind));
    }
  });

  test("the golden cases cover what the issue lists", () => {
    const files = new Set(manifest.cases.map((c) => c.file));
    for (const f of [
      "worked_example.bin",
      "three_full_blocks.bin",
      "partial_tail.bin",
      "hash0_full_block.bin",
      "l2_h2.bin",
      "bad_magic.bin",
      "bad_crc.bin",
      "version_2.bin",
      "dtype_2.bin",
      "truncated.bin",
      "fill_0.bin",
      "hash_on_partial.bin",
    ]) {
      expect(files.has(f)).toBe(true);
    }
    const worked = manifest.cases.find((c) => c.file === "worked_example.bin")!;
    expect(worked.crc).toBe("0x4f0b541c");
    expect(worked.hashes).toEqual(["0xa91ab0c1027b9366"]);
  });
});
