import { expect, test } from "bun:test";
import { Pcg32, SAMPLE_STREAM, resumeRng, stream } from "../../src/rng/index.ts";
import { fnv1a64Utf8 } from "../../src/rng/fnv1a64.ts";

const M64 = (1n << 64n) - 1n;

// Straight transcription of random-stream.md in bigint, to check the 32-bit-halves arithmetic.
function referenceStep(s: { state: bigint; inc: bigint }): number {
  const old = s.state;
  s.state = (old * 6364136223846793005n + s.inc) & M64;
  const xorshifted = Number((((old >> 18n) ^ old) >> 27n) & 0xffffffffn);
  const rot = Number(old >> 59n);
  return ((xorshifted >>> rot) | (xorshifted << ((32 - rot) & 31))) >>> 0;
}

function referenceSeeded(initstate: bigint, initseq: bigint): { state: bigint; inc: bigint } {
  const s = { state: 0n, inc: ((initseq << 1n) | 1n) & M64 };
  referenceStep(s);
  s.state = (s.state + initstate) & M64;
  referenceStep(s);
  return s;
}

test("pcg32 check values", () => {
  const r = Pcg32.seeded(42n, 54n);
  const got = Array.from({ length: 6 }, () => r.nextU32());
  expect(got).toEqual([0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e]);

  expect(SAMPLE_STREAM).toBe("sample");
  expect(fnv1a64Utf8("sample")).toBe(0xf3d802fe7a8ba4c7n);

  const s = stream(77, "sample");
  expect(Array.from({ length: 4 }, () => s.nextU32())).toEqual([0x0feddd7b, 0x33246f0e, 0x19214fc1, 0xdb7b5572]);
  expect(stream(77n, "sample").state).toBe(stream(77, "sample").state);

  const z = stream(0, "sample");
  expect(z.uniformF64()).toBe(0.8271878363608876);
  expect(z.uniformF64()).toBe(0.03362710854381101);
  expect(z.uniformF64()).toBe(0.22599509648315397);
});

test("fnv1a64 check values", () => {
  expect(fnv1a64Utf8("")).toBe(0xcbf29ce484222325n);
  expect(fnv1a64Utf8("a")).toBe(0xaf63dc4c8601ec8cn);
  expect(fnv1a64Utf8("foobar")).toBe(0x85944171f73967e8n);
});

test("pcg32 matches bigint reference", () => {
  const picker = stream(1, "test-seeds");
  const seeds: [bigint, bigint][] = [
    [0n, 0n],
    [M64, M64],
    [1n << 63n, (1n << 63n) - 1n],
  ];
  for (let i = 0; i < 20; i++) {
    const hi = (x: Pcg32) => (BigInt(x.nextU32()) << 32n) | BigInt(x.nextU32());
    seeds.push([hi(picker), hi(picker)]);
  }
  for (const [initstate, initseq] of seeds) {
    const fast = Pcg32.seeded(initstate, initseq);
    const ref = referenceSeeded(initstate, initseq);
    expect(fast.state).toBe(ref.state);
    expect(fast.inc).toBe(ref.inc);
    for (let k = 0; k < 500; k++) expect(fast.nextU32()).toBe(referenceStep(ref));
    expect(fast.state).toBe(ref.state);
  }
});

test("uniform f64 is two steps with 53 bits", () => {
  const a = stream(5, "x");
  const b = a.clone();
  const u = a.uniformF64();
  const hi = b.nextU32() >>> 5;
  const lo = b.nextU32() >>> 6;
  expect(u).toBe((hi * 2 ** 26 + lo) / 2 ** 53);
  expect(a.state).toBe(b.state);
  expect(u).toBeGreaterThanOrEqual(0);
  expect(u).toBeLessThan(1);
});

test("resume rng hands off the draws", () => {
  expect(resumeRng(77, 0).uniformF64()).toBe(0.062223279474487025);
  expect(resumeRng(77, 1).uniformF64()).toBe(0.09816454989724355);
  expect(resumeRng(77, 2).uniformF64()).toBe(0.21087040642186805);

  // Jump-ahead equals stepping: walk each stream draw by draw and compare at
  // draw counts chosen by another (fixed) stream.
  const picker = stream(2024, "test-draw-counts");
  for (const seed of [0, 77, 123456789n, M64]) {
    const targets = new Set<number>([0, 1, 2, 3]);
    for (let i = 0; i < 12; i++) targets.add(picker.nextU32() % 4000);
    const maxDraws = Math.max(...targets);
    const walker = stream(seed, SAMPLE_STREAM);
    for (let d = 0; d <= maxDraws; d++) {
      if (targets.has(d)) {
        const resumed = resumeRng(seed, d);
        expect(resumed.state).toBe(walker.state);
        expect(resumed.uniformF64()).toBe(walker.clone().uniformF64());
      }
      walker.uniformF64();
    }
  }
});

test("advance moves both ways and clone is independent", () => {
  const a = stream(9, "sample");
  const start = a.state;
  const b = a.clone();
  for (let i = 0; i < 1001; i++) a.nextU32();
  expect(b.state).toBe(start);
  b.advance(1001n);
  expect(b.state).toBe(a.state);
  b.advance(-1001n);
  expect(b.state).toBe(start);
  b.advance(0n);
  expect(b.state).toBe(start);
  const c = Pcg32.fromState(a.state, a.inc);
  expect(c.nextU32()).toBe(a.nextU32());
});

test("copy from takes state and stream and write words splits them", () => {
  const a = stream(9, "sample");
  a.advance(77n);
  // Another stream (another increment), so a copy that kept its own would draw differently.
  const scratch = stream(123, "other");
  expect(scratch.copyFrom(a)).toBe(scratch);
  expect([scratch.state, scratch.inc]).toEqual([a.state, a.inc]);
  for (let i = 0; i < 5; i++) expect(scratch.uniformF64()).toBe(a.uniformF64());
  const words = new Int32Array(6);
  a.writeWords(words, 1);
  const u64 = (hi: number, lo: number) => (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
  expect([words[0], words[5]]).toEqual([0, 0]);
  expect(u64(words[1]!, words[2]!)).toBe(a.state);
  expect(u64(words[3]!, words[4]!)).toBe(a.inc);
  const back = stream(1, "x").readWords(words, 1);
  expect([back.state, back.inc]).toEqual([a.state, a.inc]);
  expect(back.nextU32()).toBe(a.nextU32());
  expect(() => back.readWords(new Int32Array(4), 0)).toThrow("increment must be odd");
});

test("stream rejects out of range seeds", () => {
  expect(() => stream(-1, "sample")).toThrow();
  expect(() => stream(1.5, "sample")).toThrow();
  expect(() => stream(1n << 64n, "sample")).toThrow();
  expect(() => resumeRng(1, -1)).toThrow();
  expect(stream(M64, "sample").inc & 1n).toBe(1n);
});
