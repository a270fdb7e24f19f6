import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { copyBytes, mapFile } from "../../src/model/mapped-file.ts";

const dir = mkdtempSync(join(tmpdir(), "tl-mapped-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("mapped files", () => {
  test("copy_bytes_of_a_mapped_view_reads_the_file_and_equals_a_plain_copy", () => {
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

  test("copy_bytes_reads_the_mapped_file_even_after_its_path_is_replaced", () => {
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
});
