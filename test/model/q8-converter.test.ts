import { describe, expect, test } from "bun:test";
import { castMatrix, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { Q8Converter } from "../../src/model/compute/q8-converter.ts";

// `--dtype q8_0` at load runs in the wasm kernels on every core (Q8Converter); its bytes must be
// the plain quantizeQ8Row's (packed.ts) for every input, whatever the thread count and however
// the rows are cut into dispatches.

const COLS = 96;
const ROWS = 41;

/** Random 16-bit patterns, with blocks of every special kind: inf, NaN, subnormals, -0, all zero. */
function patterns(seed: number): Uint16Array {
  const u = new Uint16Array(ROWS * COLS);
  let s = seed;
  for (let i = 0; i < u.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    u[i] = s >>> 16;
  }
  u.fill(0, 32, 64);
  for (let i = 64; i < 96; i++) u[i] = 0x8000 | (i & 3);
  u[100] = 0x7c00;
  u[140] = 0xfc00;
  u[170] = 0x7e01;
  u[200] = 0x0001;
  for (let i = 224; i < 256; i++) u[i] = i & 7;
  return u;
}

/** Plausible weights: normal f16 values around 0.02, some blocks tiny (id past 2^16). */
function weights(seed: number): Float32Array {
  const f = new Float32Array(ROWS * COLS);
  let s = seed;
  for (let i = 0; i < f.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    f[i] = ((s >>> 8) / 2 ** 24 - 0.5) * (i % 96 < 32 ? 0.1 : i % 96 < 64 ? 1e-4 : 3e-7);
  }
  return f;
}

function both(m: PackedMatrix | Float32Array, threads: number, stageBytes: number): [Uint8Array, Uint8Array] {
  const ref = castMatrix(m, "q8_0", COLS) as PackedMatrix;
  const conv = Q8Converter.open(threads, stageBytes)!;
  try {
    const got = castMatrix(m, "q8_0", COLS, undefined, conv.convert.bind(conv)) as PackedMatrix;
    return [got.bytes, ref.bytes];
  } finally {
    conv.close();
  }
}

describe("Q8Converter", () => {
  for (const threads of [1, 2]) {
    for (const stageBytes of [COLS * 4 * 3, 1 << 20]) {
      test(`f16, bf16 and f32 rows give quantizeQ8Row's bytes (${threads} threads, ${stageBytes} B a dispatch)`, async () => {
        for (const seed of [1, 2]) {
          const u = patterns(seed);
          const real = new Float16Array(weights(seed));
          for (const dtype of ["f16", "bf16"] as const) {
            const [got, want] = both({ dtype, cols: COLS, length: u.length, bytes: new Uint8Array(u.buffer) }, threads, stageBytes);
            expect(got).toEqual(want);
          }
          const [got, want] = both({ dtype: "f16", cols: COLS, length: real.length, bytes: new Uint8Array(real.buffer) }, threads, stageBytes);
          expect(got).toEqual(want);
          const f = weights(seed);
          f[3] = Number.NaN;
          f[40] = Number.POSITIVE_INFINITY;
          f[300] = 1e-42;
          f[301] = -1e-45;
          const [g32, w32] = both(f, threads, stageBytes);
          expect(g32).toEqual(w32);
        }
      });
    }
  }

  test("helpers take part: a conversion on 2 threads has the helper convert chunks", async () => {
    const conv = Q8Converter.open(2, 1 << 20)!;
    try {
      await conv.ready;
      // 4 MB of f16 in 4 dispatches, again until the helper (on a busy machine, late) took a chunk.
      const cols = 2048;
      const rows = 1024;
      const src = new Float16Array(rows * cols).map((_, i) => Math.sin(i) * 0.05);
      const out = new Uint8Array(((rows * cols) / 32) * 34);
      const deadline = performance.now() + 20_000;
      do conv.convert("f16", new Uint8Array(src.buffer), rows, cols, out, 0);
      while (conv.helperChunks === 0 && performance.now() < deadline);
      expect(conv.helperChunks).toBeGreaterThan(0);
    } finally {
      conv.close();
    }
  });
});
