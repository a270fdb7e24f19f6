import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { blockPayloadBytes, EnvError, readEnvelope, writeEnvelope, type EnvelopeRecord, type KvShape } from "../../src/codec/index.ts";

const shapeArb: fc.Arbitrary<KvShape> = fc.record({
  blockTokens: fc.integer({ min: 1, max: 4 }),
  nLayers: fc.integer({ min: 1, max: 2 }),
  nKvHeads: fc.integer({ min: 1, max: 2 }),
  headDim: fc.integer({ min: 1, max: 4 }),
});

function recordArb(s: KvShape): fc.Arbitrary<EnvelopeRecord> {
  const P = blockPayloadBytes(s);
  return (
    fc
      .record({
        nTokens: fc.integer({ min: 1, max: s.blockTokens }),
        hash: fc.oneof(fc.constant(0n), fc.bigInt({ min: 1n, max: (1n << 64n) - 1n })),
        payload: fc.uint8Array({ minLength: P, maxLength: P }),
      })
      // Only full blocks carry a hash.
      .map((r) => (r.nTokens === s.blockTokens ? r : { ...r, hash: 0n }))
  );
}

const envelopeArb = shapeArb.chain((shape) => fc.array(recordArb(shape), { minLength: 1, maxLength: 4 }).map((records) => ({ shape, records })));

/** The payload as written: slots at and past the fill zeroed in every K and V section. */
function masked(s: KvShape, r: EnvelopeRecord): Uint8Array {
  const out = r.payload.slice();
  const slot = s.nKvHeads * s.headDim * 2;
  for (let sec = 0; sec < 2 * s.nLayers; sec++) {
    out.fill(0, sec * s.blockTokens * slot + r.nTokens * slot, (sec + 1) * s.blockTokens * slot);
  }
  return out;
}

describe("envelope properties", () => {
  test("random envelopes round trip", () => {
    fc.assert(
      fc.property(envelopeArb, ({ shape, records }) => {
        const buf = writeEnvelope({ version: 1, dtype: 1, nBlocks: records.length, ...shape }, records);
        const back = readEnvelope(buf, shape);
        expect(back.header).toEqual({ version: 1, dtype: 1, nBlocks: records.length, ...shape });
        expect(back.records.length).toBe(records.length);
        records.forEach((r, i) => {
          const got = back.records[i]!;
          expect(got.hash).toBe(r.hash);
          expect(got.nTokens).toBe(r.nTokens);
          expect(Buffer.from(got.payload).equals(Buffer.from(masked(shape, r)))).toBe(true);
        });
      }),
      { numRuns: 300 },
    );
  });

  test("any single flipped bit is data loss", () => {
    fc.assert(
      fc.property(envelopeArb, fc.nat(), ({ shape, records }, pick) => {
        const buf = writeEnvelope({ version: 1, dtype: 1, nBlocks: records.length, ...shape }, records);
        const bit = pick % (buf.length * 8);
        buf[bit >>> 3]! ^= 1 << (bit & 7);
        let err: unknown = null;
        try {
          readEnvelope(buf, shape);
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(EnvError);
        expect((err as EnvError).kind).toBe("Format");
        expect((err as EnvError).code).toBe(15);
      }),
      { numRuns: 400 },
    );
  });
});
