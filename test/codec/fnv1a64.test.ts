import { describe, expect, test } from "bun:test";
import { blockHash, fnv1a64, promptHashes } from "../../src/codec/index.ts";
import { xorshift } from "./support.ts";

const utf8 = (s: string) => new TextEncoder().encode(s);

function fnvRef(bytes: Uint8Array): bigint {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = BigInt.asUintN(64, (h ^ BigInt(b)) * 0x100000001b3n);
  return h;
}

describe("fnv1a64", () => {
  test("check values of kv-block.md", () => {
    expect(fnv1a64(utf8(""))).toBe(0xcbf29ce484222325n);
    expect(fnv1a64(utf8("a"))).toBe(0xaf63dc4c8601ec8cn);
    expect(fnv1a64(utf8("foobar"))).toBe(0x85944171f73967e8n);
    expect(fnv1a64(utf8("sample"))).toBe(0xf3d802fe7a8ba4c7n);
  });

  test("equals a BigInt reference on random bytes", () => {
    const rnd = xorshift(7);
    for (let n = 0; n < 300; n++) {
      const b = new Uint8Array(n);
      for (let i = 0; i < n; i++) b[i] = rnd() & 0xff;
      expect(fnv1a64(b)).toBe(fnvRef(b));
    }
    expect(fnv1a64(new Uint8Array(64).fill(0xff))).toBe(fnvRef(new Uint8Array(64).fill(0xff)));
  });

  test("chained block hashes, B=2 tokens [1,2,3,4]", () => {
    const h0 = blockHash(0n, [1, 2]);
    const h1 = blockHash(h0, [3, 4]);
    expect(h0).toBe(0xa91ab0c1027b9366n);
    expect(h1).toBe(0x03df829571605c60n);
    expect(promptHashes([1, 2, 3, 4], 2)).toEqual([h0, h1]);
    // A partial tail has no hash; the full blocks keep theirs.
    expect(promptHashes([1, 2, 3, 4, 5], 2)).toEqual([h0, h1]);
    expect(promptHashes([1], 2)).toEqual([]);
    expect(promptHashes(new Uint32Array([1, 2, 3, 4]), 2)).toEqual([h0, h1]);
  });

  test("blockHash hashes le64(parent) || le32(tokens)", () => {
    const rnd = xorshift(99);
    for (let k = 0; k < 50; k++) {
      const parent = (BigInt(rnd()) << 32n) | BigInt(rnd());
      const tokens = Array.from({ length: 1 + (rnd() % 20) }, () => rnd());
      const dv = new DataView(new ArrayBuffer(8 + 4 * tokens.length));
      dv.setBigUint64(0, parent, true);
      tokens.forEach((t, i) => dv.setUint32(8 + 4 * i, t, true));
      const want = fnvRef(new Uint8Array(dv.buffer));
      expect(blockHash(parent, tokens)).toBe(want === 0n ? 1n : want);
    }
  });

  test("prompts sharing k blocks share exactly k hashes", () => {
    const a = promptHashes([9, 8, 7, 6, 5, 4, 3, 2], 2);
    const b = promptHashes([9, 8, 7, 6, 5, 0, 3, 2], 2);
    expect(a.slice(0, 2)).toEqual(b.slice(0, 2));
    expect(a[2]).not.toBe(b[2]);
    expect(a[3]).not.toBe(b[3]); // the chain carries the difference forward
  });

  test("refuses tokens that are not u32 and bad block sizes", () => {
    expect(() => blockHash(0n, [1, -1])).toThrow();
    expect(() => blockHash(0n, [2 ** 32])).toThrow();
    expect(() => blockHash(-1n, [1])).toThrow();
    expect(() => promptHashes([1, 2], 0)).toThrow();
  });
});
