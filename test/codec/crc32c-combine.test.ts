import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { crc32c, crc32cCombine, crc32cCombineOp, crc32cCombineWith, crc32cTable } from "../../src/codec/index.ts";

const concat = (a: Uint8Array, b: Uint8Array) => {
  const ab = new Uint8Array(a.length + b.length);
  ab.set(a);
  ab.set(b, a.length);
  return ab;
};

describe("crc32cCombine", () => {
  test("crc32c combine equals concatenation", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 300 }), fc.uint8Array({ maxLength: 300 }), (a, b) => {
        const want = crc32cTable(concat(a, b));
        expect(crc32cCombine(crc32c(a), crc32c(b), b.length)).toBe(want);
        expect(crc32cCombineWith(crc32cCombineOp(b.length), crc32c(a), crc32c(b))).toBe(want);
      }),
      { numRuns: 500 },
    );
  });

  test("crc32c combine block sized payloads", () => {
    // The lengths the data plane combines over: a pool block's payload, with the
    // 40 bytes of envelope header and record head in front.
    for (const [lenA, lenB] of [
      [40, 32768],
      [0, 32768],
      [40, 0],
      [1, 65537],
      [40, 1 << 20],
    ] as const) {
      const a = new Uint8Array(lenA).map((_, i) => (i * 31 + 7) & 0xff);
      const b = new Uint8Array(lenB).map((_, i) => (i * 131 + 17 + (i >>> 9)) & 0xff);
      expect(crc32cCombine(crc32c(a), crc32c(b), lenB)).toBe(crc32c(concat(a, b)));
    }
  });

  test("crc32c combine check value", () => {
    // "123456789" split anywhere combines to the catalogue check value.
    const s = new TextEncoder().encode("123456789");
    for (let k = 0; k <= s.length; k++) {
      expect(crc32cCombine(crc32c(s.subarray(0, k)), crc32c(s.subarray(k)), s.length - k)).toBe(0xe3069283);
    }
  });

  test("crc32c combine rejects bad length", () => {
    expect(() => crc32cCombineOp(-1)).toThrow();
    expect(() => crc32cCombineOp(1.5)).toThrow();
  });
});
