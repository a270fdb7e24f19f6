import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { copyBytes, mapFile, mapFileBytes } from "../../src/model/compute/mapped-file.ts";
import { parseGguf, ggufTensor } from "../../src/model/load/gguf.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { encodeGgufModel } from "../support/model-writers.ts";
import { TINY } from "./helpers.ts";

const dir = mkdtempSync(join(tmpdir(), "tl-mapped-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("mapped files", () => {
  test("copy bytes of a mapped view reads the file and equals a plain copy", () => {
    const data = Uint8Array.from({ length: 300001 }, (_, i) => (i * 131 + 7) & 255);
    const path = join(dir, "t.bin");
    writeFileSync(path, data);
    const m = mapFile(path);
    const mem = new Uint8Array(new SharedArrayBuffer(400000));
    // Odd offsets and lengths both ways, past one read's reach, and a source that is not mapped.
    for (const [from, len, at] of [
      [0, 300001, 0],
      [12345, 99999, 7],
      [299990, 11, 399989],
    ] as const) {
      copyBytes(mem, at, m.subarray(from, from + len));
      expect(Buffer.from(mem.subarray(at, at + len)).equals(Buffer.from(data.subarray(from, from + len)))).toBe(true);
    }
    const plain = data.slice(5, 50);
    copyBytes(mem, 1, plain);
    expect(Array.from(mem.subarray(1, 46))).toEqual(Array.from(plain));
  });

  test("copy bytes reads the mapped file even after its path is replaced", () => {
    const path = join(dir, "r.bin");
    writeFileSync(
      path,
      Uint8Array.from({ length: 1000 }, (_, i) => i & 255),
    );
    const m = mapFile(path);
    writeFileSync(join(dir, "r2.bin"), new Uint8Array(1000).fill(9));
    renameSync(join(dir, "r2.bin"), path);
    const out = new Uint8Array(100);
    copyBytes(out, 0, m.subarray(300, 400));
    expect(Array.from(out)).toEqual(Array.from({ length: 100 }, (_, i) => (300 + i) & 255));
  });

  // Bun's ArrayBuffers stop at 4 GiB, so a file past one mapping (a 3B F16 is 6.4 GB) is mapped a
  // range at a time. Forced here with a 4 KB window on a small file.
  test("a file past one mapping is read as a view per range, at the right file offsets", () => {
    const data = Uint8Array.from({ length: 50000 }, (_, i) => (i * 37 + 11) & 255);
    const path = join(dir, "w.bin");
    writeFileSync(path, data);
    const fb = mapFileBytes(path, 4096);
    expect(fb).not.toBeInstanceOf(Uint8Array);
    expect(fb.length).toBe(50000);
    for (const [from, to] of [
      [0, 4096],
      [4095, 8191],
      [12345, 13000],
      [49990, 50000],
    ] as const) {
      const v = fb.subarray(from, to);
      expect(Buffer.from(v).equals(Buffer.from(data.subarray(from, to)))).toBe(true);
      // copyBytes reads a window's views from the file at their own offsets, a sub-view too.
      const out = new Uint8Array(to - from);
      copyBytes(out, 0, v);
      expect(Buffer.from(out).equals(Buffer.from(data.subarray(from, to)))).toBe(true);
      const inner = new Uint8Array(to - from - 2);
      copyBytes(inner, 0, v.subarray(1, to - from - 1));
      expect(Buffer.from(inner).equals(Buffer.from(data.subarray(from + 1, to - 1)))).toBe(true);
    }
    expect(() => fb.subarray(0, 4097)).toThrow(/a range of 4097 bytes is past the largest mapping \(4096\)/);
    expect(() => fb.subarray(49999, 50001)).toThrow(RangeError);
  });

  test("a GGUF file read through windows gives the tensors a whole mapping gives", () => {
    const path = join(dir, "m.gguf");
    writeFileSync(path, encodeGgufModel(TINY, syntheticWeights(TINY, 3), { type: "f16" }));
    const whole = mapFile(path);
    const fb = mapFileBytes(path, 8192);
    const g = parseGguf(whole, path);
    const gw = parseGguf(fb.subarray(0, 8192), path, fb.length);
    expect(gw.tensors).toEqual(g.tensors);
    for (const t of g.tensors) {
      const a = ggufTensor(whole, g, t).bytes;
      const b = ggufTensor(fb, gw, t).bytes;
      expect(Buffer.from(b).equals(Buffer.from(a))).toBe(true);
    }
  });
});
