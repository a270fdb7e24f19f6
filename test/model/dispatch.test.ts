import { describe, expect, test } from "bun:test";
import { decodeHeadsPerPiece } from "../../src/model/compute/attention-pieces.ts";
import { JOB_INTS } from "../../src/model/compute/kernel-exports.ts";
import { F16_SHIFTED, J_ATTEND, J_CONVERT_Q8, J_PLACE, J_QUANT_X, J_SWIGLU, J_TOUCH, KERNEL_INDEX, runJobs } from "../../src/model/compute/kernel-threads.ts";
import { readFileSync } from "node:fs";
import { MatmulKernel, matmulRef } from "../../src/model/compute/matmul.ts";
import { LEGACY_DTYPES } from "../../src/model/compute/legacy-quants.ts";
import { castMatrix, dequantize, type Matrix } from "../../src/model/compute/packed.ts";
import { bits } from "./helpers.ts";
import { legacyBlocks } from "./quant-helpers.ts";

// Big enough that every call is split over the threads (SPLIT_MACS) into many chunks.
const N = 96;
const D = 1000;

function weights(d: number, n: number, seed: number): Float32Array {
  return new Float32Array(d * n).map((_, i) => Math.sin(i * 0.731 + seed) * 0.5);
}

function input(rows: number, n: number, seed: number): Float32Array {
  return new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + seed) * 2);
}

/** The fixed-order reference of y = x W^T (16-bit weights made f32 first, which is exact). */
function want(w: Matrix, x: Float32Array, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  matmulRef(y, x, w instanceof Float32Array ? w : dequantize(w), 0, rows, n, d);
  return bits(y);
}

describe("dispatch", () => {
  test("the caller finishes a dispatch alone when no helper has started", () => {
    // Right after construction no helper has instantiated the kernels yet: the caller takes its
    // own range, then steals every chunk of theirs, and the dispatch ends without them.
    const w = weights(D, N, 1);
    const k = new MatmulKernel([{ matrix: w, cols: N }], { threads: 3 });
    try {
      for (const rows of [1, 3, 8]) {
        const x = input(rows, N, rows);
        const y = new Float32Array(rows * D);
        k.matmul(y, x, k.views[0]!, 0, rows, N, D);
        expect(bits(y)).toEqual(want(w, x, rows, N, D));
      }
    } finally {
      k.close();
    }
  });

  test("back to back dispatches of changing shapes give the reference bits on every thread count", async () => {
    // Helpers still looking for chunks of one dispatch while the next is written must never
    // compute from a half-written job: thousands of dispatches, each a different shape, dtype
    // or row offset from the last, checked bit for bit.
    const mats: Matrix[] = [weights(D, N, 2), castMatrix(weights(640, 128, 3), "f16", 128), castMatrix(weights(512, 64, 4), "bf16", 64)];
    const shapes = [
      { m: 0, n: N, d: D, rows: 1 },
      { m: 1, n: 128, d: 640, rows: 2 },
      { m: 2, n: 64, d: 512, rows: 8 },
      { m: 0, n: N, d: 512, rows: 3 },
    ];
    const wants = shapes.map((s) => want(mats[s.m]!, input(s.rows, s.n, s.m), s.rows, s.n, s.d));
    for (const threads of [2, 3]) {
      const k = new MatmulKernel(
        mats.map((m, i) => ({ matrix: m, cols: shapes.find((s) => s.m === i)!.n })),
        { threads },
      );
      try {
        await k.ready();
        const xs = shapes.map((s) => {
          const x = k.alloc(s.rows * s.n);
          x.set(input(s.rows, s.n, s.m));
          return x;
        });
        const ys = shapes.map((s) => k.alloc(s.rows * s.d));
        for (let i = 0; i < 2000; i++) {
          const j = (i * 7) % shapes.length;
          const s = shapes[j]!;
          ys[j]!.fill(Number.NaN);
          k.matmul(ys[j]!, xs[j]!, k.views[s.m]!, 0, s.rows, s.n, s.d);
          if (i % 97 === 0 || i >= 1996) expect(bits(ys[j]!)).toEqual(wants[j]!);
        }
        expect(k.splitCalls).toBeGreaterThan(0);
      } finally {
        k.close();
      }
    }
  });
});

/** y = x W^T of each of mats (rows of n, d outputs) on a kernel of `threads` and `tileXBytes`, as bits. */
async function bitsOfEach(
  mats: Matrix[],
  x: Float32Array,
  rows: number,
  n: number,
  d: number,
  threads: number,
  tileXBytes: number | undefined,
): Promise<number[][]> {
  const k = new MatmulKernel(
    mats.map((matrix) => ({ matrix, cols: n })),
    { threads, tileXBytes },
  );
  try {
    await k.ready();
    const xk = k.alloc(rows * n);
    xk.set(x);
    const y = k.alloc(rows * d);
    return mats.map((_, m) => {
      y.fill(Number.NaN);
      k.matmul(y, xk, k.views[m]!, 0, rows, n, d);
      return bits(y);
    });
  } finally {
    k.close();
  }
}

describe("one-token streams", () => {
  test("a one-token matmul walked four strips in step gives one thread's bits, for every kernel and cut", async () => {
    // One token row: a chunk of a dispatch takes a piece of each quarter of the job (runChunk's
    // STREAMS), four strips in step. 1000 rows cut 4 chunks of 4 pieces of 64 rows, the last
    // piece past the end (taken one piece after another); a job starting at row 3 has its first
    // piece partly before it; 4000 rows 16 chunks. f16 also with an x past 2^16 (not scaled).
    const n = 256;
    const dtypes = ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k"] as const;
    for (const total of [1000, 4000]) {
      const mats = [
        ...dtypes.map((dt, i) => castMatrix(weights(total, n, 50 + i), dt, n)),
        ...LEGACY_DTYPES.map((dt, i) => legacyBlocks(dt, total, n, 60 + i)),
      ];
      for (const [r, d] of [
        [0, total],
        [3, total - 3],
        [8, total - 40],
      ] as const) {
        for (const big of [false, true]) {
          const x = input(1, n, 7).map((v) => (big ? v * 1e5 : v));
          // rows 2: x twice, by the batch paths (no streams); its first row's outputs are the one-token bits.
          const run = async (threads: number, rows = 1) => {
            const k = new MatmulKernel(
              mats.map((matrix) => ({ matrix, cols: n })),
              { threads },
            );
            try {
              await k.ready();
              const xk = k.alloc(rows * n);
              for (let t = 0; t < rows; t++) xk.set(x, t * n);
              const y = k.alloc(rows * d);
              return mats.map((_, m) => {
                y.fill(Number.NaN);
                k.matmul(y, xk, k.views[m]!, r * n, rows, n, d);
                return bits(y.subarray(0, d));
              });
            } finally {
              k.close();
            }
          };
          const one = await run(1);
          expect(await run(1, 2)).toEqual(one);
          for (const threads of [2, 3]) expect(await run(threads)).toEqual(one);
          // The 16-bit and f32 kernels against the plain reference too.
          for (const m of [0, 1, 2]) {
            const mm = mats[m]!;
            const w = mm instanceof Float32Array ? mm : dequantize(mm);
            const y = new Float32Array(d);
            matmulRef(y, x, w.subarray(r * n), 0, 1, n, d);
            expect(one[m]).toEqual(bits(y));
          }
        }
      }
    }
  });
});

describe("small-batch streams", () => {
  test("every integer kernel against 2 to 7 token rows, and the 16-bit ones against 2 or 3, walked in four streams give each row its bits", async () => {
    // 2-7 rows of the integer kernels take THE STREAMS as one token does (kquants.ts'
    // kStreamsQ4Rows, kStreamsQ5Rows and kStreamsQ6Rows, q8.ts' streamsRows and pairRuns,
    // legacy.ts' streamsRows): the K types' and q8_0's first four tokens (or two, or three) four
    // strips in step and the rest strip by strip, the legacy types' every token. 1000 and 4000
    // rows, jobs cut at 0, 3 and 8 as above; each row's outputs must be what the same rows give on
    // one thread (no streams), on 1, 2 and 3 threads.
    // The 16-bit kernels take 2 and 3 rows so (matmul.ts' streamsRows): f16 in the shifted coding
    // and plain (a weight of 300), bf16, and f16 with an x past 2^16 (not scaled: one piece after
    // another).
    const n = 256;
    const cases: [number, string, Matrix, number][] = [];
    for (const total of [1000, 4000]) {
      for (const dt of ["q4_k", "q5_k", "q6_k", "q8_0", "f16", "bf16"] as const) cases.push([total, dt, castMatrix(weights(total, n, 70), dt, n), 1]);
    }
    for (const [i, dt] of LEGACY_DTYPES.entries()) cases.push([1000, dt, legacyBlocks(dt, 1000, n, 30 + i), 1]);
    const plain = weights(1000, n, 71);
    plain[5] = 300;
    cases.push([1000, "f16 plain", castMatrix(plain, "f16", n), 1]);
    cases.push([1000, "f16, x past 2^16", castMatrix(weights(1000, n, 72), "f16", n), 1e5]);
    for (const [total, dt, w, scale] of cases) {
      for (const [r, d] of [
        [0, total],
        [3, total - 3],
        [8, total - 40],
      ] as const) {
        const run = async (threads: number, rows: number) => {
          const k = new MatmulKernel([{ matrix: w, cols: n }], { threads });
          try {
            await k.ready();
            const xk = k.alloc(rows * n);
            xk.set(input(rows, n, 9).map((v) => v * scale));
            const y = k.alloc(rows * d).fill(Number.NaN);
            k.matmul(y, xk, k.views[0]!, r * n, rows, n, d);
            return bits(y);
          } finally {
            k.close();
          }
        };
        const alone = await run(1, 7);
        for (const rows of [2, 3, 4, 5, 7]) {
          for (const threads of [1, 2, 3])
            expect({ dt, rows, threads, y: await run(threads, rows) }).toEqual({ dt, rows, threads, y: alone.slice(0, rows * d) });
        }
      }
    }
  });
});

describe("token tiles", () => {
  test("a matmul run a tile of token rows at a time gives the bits of the whole rows, for every kernel", async () => {
    // tileXBytes 1 makes every tile 4 token rows, so 23 rows are five tiles and a tail of 3 (an
    // odd one, which the kernels take by their one-token path); 4096 bytes gives the f32 rows of
    // n = 256 tiles of 4 and the quantized ones their own.
    const n = 256;
    const d = 200;
    const rows = 23;
    const dtypes = ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k"] as const; // f32 x: never tiled, checked all the same
    const mats = [...dtypes.map((dt, i) => castMatrix(weights(d, n, 10 + i), dt, n)), ...LEGACY_DTYPES.map((dt, i) => legacyBlocks(dt, d, n, 20 + i))];
    const x = input(rows, n, 5);
    const run = (threads: number, tileXBytes: number | undefined) => bitsOfEach(mats, x, rows, n, d, threads, tileXBytes);
    const whole = await run(1, 0);
    expect(await run(2, 0)).toEqual(whole);
    // 1 thread: runJobs' matmul_tiled, rows in blocks as a dispatch's chunks; 2 and 3: the chunks' tiles.
    for (const threads of [1, 2, 3]) for (const tile of [1, 4096]) expect(await run(threads, tile)).toEqual(whole);
  });

  test("a prefill's x, quantized over the threads a block of rows each, gives the bits of one thread's", async () => {
    // 70 token rows: past QUANT_SPLIT_ROWS, so 2 and 3 threads quantize x by chunks of rows
    // (J_QUANT_X) where 1 thread quantizes it whole; tiles off, so only the quantizing differs.
    const n = 512;
    const d = 64;
    const rows = 70;
    const dtypes = ["q8_0", "q4_k", "q5_k", "q6_k"] as const;
    const mats = [...dtypes.map((dt, i) => castMatrix(weights(d, n, 30 + i), dt, n)), ...LEGACY_DTYPES.map((dt, i) => legacyBlocks(dt, d, n, 40 + i))];
    const x = input(rows, n, 9);
    const run = (threads: number) => bitsOfEach(mats, x, rows, n, d, threads, 0);
    const one = await run(1);
    for (const threads of [2, 3]) expect(await run(threads)).toEqual(one);
  });

  test("a tile size that is not a byte count is refused", () => {
    expect(() => new MatmulKernel([], { threads: 2, tileXBytes: -1 })).toThrow("tileXBytes -1");
  });
});

describe("job records", () => {
  test("runJobs refuses job records outside the kernel's memory: the kernels take their address", () => {
    // An array of the JS heap has no address in the kernel's memory: its byteOffset would name
    // whatever sits there, and the kernel would write through it.
    const k = new MatmulKernel([{ matrix: weights(D, N, 1), cols: N }]);
    try {
      expect(() => runJobs(k.exports!, new Int32Array(JOB_INTS), 1, 0)).toThrow(/kernel's memory/);
    } finally {
      k.close();
    }
  });
});

describe("attention pieces", () => {
  test("a decoding sequence is cut into as few pieces as keep every thread busy", () => {
    expect(decodeHeadsPerPiece(6, 1, 1)).toBe(6);
    expect(decodeHeadsPerPiece(6, 1, 2)).toBe(3);
    expect(decodeHeadsPerPiece(6, 1, 3)).toBe(2);
    expect(decodeHeadsPerPiece(6, 2, 2)).toBe(6);
    expect(decodeHeadsPerPiece(6, 3, 2)).toBe(3);
    expect(decodeHeadsPerPiece(6, 8, 2)).toBe(6);
    expect(decodeHeadsPerPiece(1, 1, 4)).toBe(1);
    expect(decodeHeadsPerPiece(32, 1, 3)).toBe(11);
  });
});

describe("job kinds", () => {
  test("every fn number names one kind, the same in the kernels' dispatch as here", () => {
    const js: Record<string, number> = {
      F16S: F16_SHIFTED,
      ATTEND: J_ATTEND,
      CONVERT_Q8: J_CONVERT_Q8,
      PLACE: J_PLACE,
      QUANT_X: J_QUANT_X,
      TOUCH: J_TOUCH,
      SWIGLU: J_SWIGLU,
    };
    for (const [dt, i] of Object.entries(KERNEL_INDEX)) js[dt.toUpperCase()] = i;
    // Both sides' numbers distinct: a new kind on a dtype's number runs as that matmul (or the reverse).
    expect(new Set(Object.values(js)).size).toBe(Object.keys(js).length);
    const asm = (file: string) =>
      Object.fromEntries(
        [
          ...readFileSync(new URL(`../../src/model/compute/kernels/assembly/${file}`, import.meta.url), "utf8").matchAll(
            /^(?:export )?const ([A-Z0-9_]+): i32 = (\d+);/gm,
          ),
        ].map((m) => [m[1]!, Number(m[2])]),
      );
    const kernels = { ...asm("dtype-index.ts"), ...asm("dispatch.ts") };
    for (const name of Object.keys(js)) expect([name, kernels[name]]).toEqual([name, js[name]]);
  });
});
