import { describe, expect, test } from "bun:test";
import {
  blockHash,
  blockPayloadBytes,
  chunkRecordHash,
  crc32c,
  envelopeBytes,
  envelopeRecordAt,
  EnvError,
  f16Bytes,
  fnv1a64,
  grpcCodeNameOf,
  grpcCodeOf,
  promptHashes,
  readEnvelope,
  verifyEnvelope,
  writeEnvelope,
  type EnvelopeHeader,
  type EnvelopeRecord,
  type KvShape,
} from "../../src/codec/index.ts";
import { elemOffset, expectRefused, fixCrc } from "./support.ts";

const DATA_LOSS = 15;
const FAILED_PRECONDITION = 9;

const WORKED_HEX =
  "54 4c 4b 56 01 00 01 00 01 00 00 00 02 00 00 00 01 00 00 00 01 00 00 00 02 00 00 00 66 93 7b 02 " +
  "c1 b0 1a a9 02 00 00 00 00 3c 00 40 00 42 00 44 00 38 00 bc 00 00 00 34 1c 54 0b 4f";

const hexOf = (b: Uint8Array) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join(" ");
const header = (s: KvShape, nBlocks: number): EnvelopeHeader => ({ version: 1, dtype: 1, nBlocks, ...s });

describe("envelope", () => {
  test("hand example envelope", () => {
    const s: KvShape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };
    expect(blockPayloadBytes(s)).toBe(16);
    expect(envelopeBytes(s, 1)).toBe(60);
    const block = new Float16Array(blockPayloadBytes(s) / 2);
    const K = [
      [1, 2],
      [3, 4],
    ];
    const V = [
      [0.5, -1],
      [0, 0.25],
    ];
    for (let slot = 0; slot < 2; slot++) {
      for (let d = 0; d < 2; d++) {
        block[elemOffset(s, 0, 0, slot, 0) + d] = K[slot]![d]!;
        block[elemOffset(s, 0, 1, slot, 0) + d] = V[slot]![d]!;
      }
    }
    const [h0] = promptHashes([1, 2], 2);
    expect(h0).toBe(0xa91ab0c1027b9366n);
    const env = writeEnvelope(header(s, 1), [{ hash: h0!, nTokens: 2, payload: f16Bytes(block) }]);
    expect(hexOf(env)).toBe(WORKED_HEX);
    expect(crc32c(env.subarray(0, 56))).toBe(0x4f0b541c);

    // Both chained hashes with B=2 over [1,2,3,4], and the check values.
    expect(promptHashes([1, 2, 3, 4], 2)).toEqual([0xa91ab0c1027b9366n, 0x03df829571605c60n]);
    expect(blockHash(0xa91ab0c1027b9366n, [3, 4])).toBe(0x03df829571605c60n);
    expect(fnv1a64(new TextEncoder().encode(""))).toBe(0xcbf29ce484222325n);
    expect(fnv1a64(new TextEncoder().encode("a"))).toBe(0xaf63dc4c8601ec8cn);
    expect(fnv1a64(new TextEncoder().encode("foobar"))).toBe(0x85944171f73967e8n);
    expect(crc32c(new TextEncoder().encode("123456789"))).toBe(0xe3069283);

    const { header: h, records } = readEnvelope(env, s);
    expect(h).toEqual(header(s, 1));
    expect(records.length).toBe(1);
    expect(records[0]!.hash).toBe(h0!);
    expect(records[0]!.nTokens).toBe(2);
    expect(Array.from(new Float16Array(records[0]!.payload.slice().buffer))).toEqual([1, 2, 3, 4, 0.5, -1, 0, 0.25]);
    // Zero-copy: the payload is a view at offset 28 + 12 of the envelope.
    expect(records[0]!.payload.buffer).toBe(env.buffer);
    expect(records[0]!.payload.byteOffset).toBe(env.byteOffset + 40);
  });

  // A valid base: B=2 L=1 H=1 D=2, a full block with its hash and a partial tail.
  const S: KvShape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };
  const P = blockPayloadBytes(S);
  const REC = 12 + P;
  function base(): Uint8Array {
    const full = new Uint8Array(P).map((_, i) => i + 1);
    const tail = new Uint8Array(P).map((_, i) => (i % 8 < 4 ? 100 + i : 0)); // slot 0 only
    const [h] = promptHashes([7, 8, 9], 2);
    return writeEnvelope(header(S, 2), [
      { hash: h!, nTokens: 2, payload: full },
      { hash: 0n, nTokens: 1, payload: tail },
    ]);
  }
  const u16 = (b: Uint8Array, o: number, v: number) => (new DataView(b.buffer, b.byteOffset).setUint16(o, v, true), b);
  const u32 = (b: Uint8Array, o: number, v: number) => (new DataView(b.buffer, b.byteOffset).setUint32(o, v, true), b);
  const u64 = (b: Uint8Array, o: number, v: bigint) => (new DataView(b.buffer, b.byteOffset).setBigUint64(o, v, true), b);

  test("envelope reader rules", () => {
    expect(readEnvelope(base(), S).records.length).toBe(2);

    // Rule 1: length ≥ 32.
    for (const len of [0, 1, 4, 31]) expectRefused(() => readEnvelope(base().subarray(0, len)), "Format", 1, DATA_LOSS);
    // Rule 2: magic.
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 0, 0x564b4c55))), "Format", 2, DATA_LOSS);
    // Rule 3: CRC, over payload bits, header bits and the trailer itself.
    for (const at of [5, 30, 28 + REC + 13, 80 - 1]) {
      const b = base();
      b[at]! ^= 0x01;
      const e = expectRefused(() => readEnvelope(b), "Format", 3, DATA_LOSS);
      expect(e.message).toMatch(/^rule 3: crc mismatch: got 0x[0-9a-f]{8}, want 0x[0-9a-f]{8}/);
    }
    // Rule 4: version (valid CRC), rule 5: dtype.
    for (const v of [0, 2, 0xffff]) {
      const e = expectRefused(() => readEnvelope(fixCrc(u16(base(), 4, v))), "Version", 4, FAILED_PRECONDITION);
      expect(e.message).toContain(`version ${v}`);
    }
    for (const v of [0, 2]) expectRefused(() => readEnvelope(fixCrc(u16(base(), 6, v))), "Version", 5, FAILED_PRECONDITION);
    // Rule 6: dimensions ≥ 1, and len = E.
    for (const off of [12, 16, 20, 24]) expectRefused(() => readEnvelope(fixCrc(u32(base(), off, 0))), "Format", 6, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 8, 3))), "Format", 6, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 8, 1))), "Format", 6, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 8, 0))), "Format", 6, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(base().slice(0, 80 - 2))), "Format", 6, DATA_LOSS);
    {
      const longer = new Uint8Array(84);
      longer.set(base().subarray(0, 76));
      expectRefused(() => readEnvelope(fixCrc(longer)), "Format", 6, DATA_LOSS);
    }
    {
      // Products far past 2^53 must not wrap into a plausible length.
      const b = base();
      for (const off of [8, 12, 16, 20, 24]) u32(b, off, 0xffffffff);
      expectRefused(() => readEnvelope(fixCrc(b)), "Format", 6, DATA_LOSS);
      // 2^32·(12+P) wraps to a small number in 32-bit arithmetic; here it must not match.
      const c = base();
      u32(c, 8, 2 + 2 ** 32 / 2);
      expectRefused(() => readEnvelope(fixCrc(c)), "Format", 6, DATA_LOSS);
    }
    // Rule 7: the expected shape, each dimension in turn; only checked when given.
    for (const k of ["blockTokens", "nLayers", "nKvHeads", "headDim"] as const) {
      const e = expectRefused(() => readEnvelope(base(), { ...S, [k]: S[k] + 1 }), "Shape", 7, FAILED_PRECONDITION);
      expect(e.message).toContain("B=2 L=1 H=1 D=2");
    }
    expect(readEnvelope(base()).header.blockTokens).toBe(2);
    // Rule 8: fill in 1..B, on any record.
    for (const [rec, fill] of [
      [0, 0],
      [1, 0],
      [1, 3],
      [0, 0xffffffff],
    ] as const) {
      expectRefused(() => readEnvelope(fixCrc(u32(base(), 28 + rec * REC + 8, fill))), "Format", 8, DATA_LOSS);
    }
    // Rule 9: a hash on a partial block — a writer that hashed the tail, or dropped a fill.
    expectRefused(() => readEnvelope(fixCrc(u64(base(), 28 + REC, 0x1234n))), "Format", 9, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u64(base(), 28 + REC, 1n << 63n))), "Format", 9, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 28 + 8, 1))), "Format", 9, DATA_LOSS);
    // A full block with hash 0 (not owned by the writer) is valid.
    expect(readEnvelope(fixCrc(u64(base(), 28, 0n))).records[0]!.hash).toBe(0n);

    // Order: each pair of breaks reports the earlier rule.
    expectRefused(() => readEnvelope(u32(base(), 0, 0).subarray(0, 31)), "Format", 1, DATA_LOSS);
    expectRefused(() => readEnvelope(u32(base(), 0, 0)), "Format", 2, DATA_LOSS); // magic and crc
    expectRefused(() => readEnvelope(u16(base(), 4, 2)), "Format", 3, DATA_LOSS); // crc and version
    expectRefused(() => readEnvelope(fixCrc(u16(u16(base(), 4, 2), 6, 2))), "Version", 4, FAILED_PRECONDITION);
    expectRefused(() => readEnvelope(fixCrc(u32(u16(base(), 6, 2), 24, 0))), "Version", 5, FAILED_PRECONDITION);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 24, 0)), { ...S, headDim: 9 }), "Format", 6, DATA_LOSS);
    expectRefused(() => readEnvelope(fixCrc(u32(base(), 28 + 8, 0)), { ...S, nLayers: 2 }), "Shape", 7, FAILED_PRECONDITION);
    // Rule 8 over every record before rule 9 over any: record 0 breaks 9, record 1 breaks 8.
    expectRefused(() => readEnvelope(fixCrc(u32(u32(base(), 28 + 8, 1), 28 + REC + 8, 0))), "Format", 8, DATA_LOSS);

    // The error kinds map to gRPC codes (numbers of Connect's Code enum).
    expect(grpcCodeOf("Format")).toBe(DATA_LOSS);
    expect(grpcCodeOf("Version")).toBe(FAILED_PRECONDITION);
    expect(grpcCodeOf("Shape")).toBe(FAILED_PRECONDITION);
    expect(grpcCodeNameOf("Format")).toBe("DATA_LOSS");
    expect(grpcCodeNameOf("Shape")).toBe("FAILED_PRECONDITION");
  });

  test("a v1 reader refuses version 2 with a valid crc, and says so", () => {
    const b = fixCrc(u16(base(), 4, 2));
    expect(() => verifyEnvelope(b)).toThrow("rule 4: version 2 not readable");
    expect(() => verifyEnvelope(b)).toThrow(EnvError);
  });

  test("hash disagreements between a chunk and its record", () => {
    const [h0, h1] = promptHashes([7, 8, 9, 10], 2);
    const full = (hash: bigint): EnvelopeRecord => ({ hash, nTokens: 2, payload: new Uint8Array(P) });
    const tail: EnvelopeRecord = { hash: 0n, nTokens: 1, payload: new Uint8Array(P) };
    expect(chunkRecordHash(h0!, full(h0!), 2)).toBe(h0!);
    expect(chunkRecordHash(h1!, full(h0!), 2)).toBeNull(); // a record hash that is not the chunk's
    expect(chunkRecordHash(0n, full(h0!), 2)).toBeNull();
    expect(chunkRecordHash(h1!, full(0n), 2)).toBe(h1!); // not owned by the sender: take the chunk's hash
    expect(chunkRecordHash(0n, tail, 2)).toBe(0n);
    expect(chunkRecordHash(h0!, tail, 2)).toBeNull(); // a hash claimed for a partial block
  });

  test("writer: out buffer reuse, zeros past the fill, programmer errors", () => {
    const payload = new Uint8Array(P).fill(0xee);
    const recs = [{ hash: 0n, nTokens: 1, payload }];
    const fresh = writeEnvelope(header(S, 1), recs);
    expect(fresh.length).toBe(envelopeBytes(S, 1));
    const out = new Uint8Array(200).fill(0x55);
    const into = writeEnvelope(header(S, 1), recs, out);
    expect(into.buffer).toBe(out.buffer);
    expect(into.length).toBe(fresh.length);
    expect(Array.from(into)).toEqual(Array.from(fresh));
    expect(out[fresh.length]).toBe(0x55);
    expect(writeEnvelope(header(S, 1), recs, new Uint8Array(10)).buffer).not.toBe(out.buffer);
    // Slots at and past the fill: zero in K and V, whatever the payload held.
    const r = readEnvelope(fresh).records[0]!;
    const perSlot = S.nKvHeads * S.headDim * 2;
    for (let sec = 0; sec < 2 * S.nLayers; sec++) {
      const at = sec * S.blockTokens * perSlot;
      expect(Array.from(r.payload.subarray(at, at + perSlot))).toEqual(new Array(perSlot).fill(0xee));
      expect(Array.from(r.payload.subarray(at + perSlot, at + 2 * perSlot))).toEqual(new Array(perSlot).fill(0));
    }
    expect(() => writeEnvelope(header(S, 1), [{ hash: 0n, nTokens: 1, payload: new Uint8Array(P - 2) }])).toThrow(/payload is 14 bytes, want P = 16/);
    expect(() => writeEnvelope(header(S, 2), recs)).toThrow(/nBlocks/);
    expect(() => writeEnvelope(header(S, 1), [{ hash: 5n, nTokens: 1, payload }])).toThrow(/partial/);
    expect(() => writeEnvelope(header(S, 1), [{ hash: 0n, nTokens: 0, payload }])).toThrow(/fill/);
    expect(() => writeEnvelope(header(S, 1), [{ hash: 1n << 64n, nTokens: 2, payload }])).toThrow(/u64/);
    expect(() => writeEnvelope({ ...header(S, 1), version: 2 }, recs)).toThrow(/version/);
    expect(() => writeEnvelope({ ...header(S, 1), headDim: 0 }, recs)).toThrow(/headDim/);
    // An empty envelope is well formed: 32 bytes.
    expect(readEnvelope(writeEnvelope(header(S, 0), [])).records).toEqual([]);
  });

  test("verifyEnvelope + envelopeRecordAt read one record without the array", () => {
    const b = base();
    const h = verifyEnvelope(b, S);
    expect(h.nBlocks).toBe(2);
    const r1 = envelopeRecordAt(b, h, 1);
    expect(r1.nTokens).toBe(1);
    expect(r1.hash).toBe(0n);
    expect(r1.payload.byteOffset).toBe(b.byteOffset + 28 + REC + 12);
    expect(() => envelopeRecordAt(b, h, 2)).toThrow();
  });
});
