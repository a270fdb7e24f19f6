import { expect, test } from "bun:test";
import fc from "fast-check";
import { blockPayloadBytes, crc32c, writeEnvelope } from "../../src/codec/index.ts";
import { OneBlockEnvelopeWriter } from "../../src/codec/index.ts";

test("one block writer matches write envelope", () => {
  fc.assert(
    fc.property(
      fc.record({
        blockTokens: fc.integer({ min: 1, max: 5 }),
        nLayers: fc.integer({ min: 1, max: 3 }),
        nKvHeads: fc.integer({ min: 1, max: 3 }),
        headDim: fc.integer({ min: 1, max: 4 }),
      }),
      fc.integer({ min: 0, max: 1000 }),
      fc.bigInt({ min: 1n, max: (1n << 64n) - 1n }),
      fc.boolean(),
      fc.integer({ min: 0, max: 64 }),
      (shape, seed, hash, full, at) => {
        const P = blockPayloadBytes(shape);
        const payload = new Uint8Array(P).map((_, i) => (i * 31 + seed) & 0xff); // non-zero past the fill too
        const fill = full ? shape.blockTokens : 1 + (seed % shape.blockTokens);
        const h = full ? hash : 0n;
        const want = writeEnvelope({ version: 1, dtype: 1, nBlocks: 1, ...shape }, [{ hash: h, nTokens: fill, payload }]);
        const w = new OneBlockEnvelopeWriter(shape);
        const out = new Uint8Array(at + w.bytes + 7).fill(0xee);
        const crc = w.write(out, at, h, fill, payload);
        expect(Buffer.from(out.subarray(at, at + w.bytes)).equals(Buffer.from(want))).toBe(true);
        expect(crc).toBe(crc32c(want));
        expect(out[at - 1] ?? 0xee).toBe(0xee); // nothing written outside [at, at + bytes)
        expect(out[at + w.bytes]).toBe(0xee);
        // With the payload's CRC known (a pool's cached one), the same bytes and CRC.
        const out2 = new Uint8Array(at + w.bytes + 7).fill(0xee);
        expect(w.write(out2, at, h, fill, payload, crc32c(payload))).toBe(crc32c(want));
        expect(Buffer.from(out2).equals(Buffer.from(out))).toBe(true);
      },
    ),
    { numRuns: 300 },
  );
});
