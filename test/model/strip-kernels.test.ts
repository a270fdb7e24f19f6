import { afterAll, describe, expect, test } from "bun:test";
import { MatmulKernel, matmulRef } from "../../src/model/compute/matmul.ts";
import { castMatrix, type DType, dequantize, type Matrix, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { bits, expectSlices } from "./helpers.ts";
import { placedShifted } from "./quant-helpers.ts";

// The strip-layout kernels against matmulRef, bit for bit: every tile (batch 1 strips, 4x2 tiles,
// the odd token, single rows of strips cut by a slice or a thread), every dtype, every tail.

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

function kernel(ms: { matrix: Matrix; cols: number }[], threads = 1): MatmulKernel {
  const k = new MatmulKernel(ms, { threads });
  kernels.push(k);
  return k;
}

function weights(dt: DType, d: number, n: number, seed: number): Matrix {
  const f = new Float32Array(d * n).map((_, i) => Math.sin(i * 0.61 + seed) * (1 + (i % 7)) * 10 ** ((i % 5) - 2));
  return castMatrix(f, dt, n);
}

function input(rows: number, n: number, seed: number): Float32Array {
  return new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + seed) * 3);
}

function ref(x: Float32Array, w: Matrix, wOff: number, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  // matmulRef reads packed w itself: 16-bit dequantized exactly, q8_0 in its integer order.
  matmulRef(y, x, w, wOff, rows, n, d);
  return bits(y);
}

const NS: Partial<Record<DType, number[]>> = {
  f32: [1, 3, 4, 9, 36, 42],
  f16: [1, 5, 8, 12, 15, 40, 44],
  bf16: [3, 8, 13, 44],
  q8_0: [32, 96],
  q4_k: [256],
  q6_k: [256],
  q5_k: [256],
};

/** 29 rows of n weights (three whole strips and a padded fourth): every tile and slice against matmulRef. */
function expectTiles(k: MatmulKernel, w: Matrix, n: number, rowCounts: readonly number[]): void {
  const slices = [
    [0, 29],
    [8, 16],
    [3, 9],
    [5, 1],
    [11, 17],
    [24, 5],
  ] as const;
  expectSlices(k, w, n, rowCounts, slices, input, ref);
}

/** One token row holding big and -big / 3 against d rows of n: matmulRef's bits for each big. */
function expectBigX(k: MatmulKernel, w: Matrix, n: number, d: number, bigs: readonly number[]): void {
  for (const big of bigs) {
    const x = input(1, n, 4);
    x[5] = big;
    x[17] = -big / 3;
    const y = new Float32Array(d);
    k.matmul(y, x, w, 0, 1, n, d);
    expect([n, big, bits(y)]).toEqual([n, big, ref(x, w, 0, 1, n, d)]);
  }
}

/** An f16 matrix of the 16-bit patterns (rows of 64, the last padded with zeros) read back row by row exactly; the kernel it was placed in. */
function expectRowsRead(patterns: Uint16Array): { k: MatmulKernel; w: PackedMatrix; rows: number } {
  const n = 64;
  const u = new Uint16Array(Math.ceil(patterns.length / n) * n);
  u.set(patterns);
  const w: PackedMatrix = { dtype: "f16", cols: n, length: u.length, bytes: new Uint8Array(u.buffer) };
  const want = new Float32Array(new Float16Array(u.buffer));
  const k = kernel([{ matrix: w, cols: n }]);
  const got = new Float32Array(u.length);
  for (let r = 0; r < u.length / n; r++) k.rowInto(k.views[0]!, r * n, n, got, r * n);
  expect(bits(got)).toEqual(bits(want));
  return { k, w, rows: u.length / n };
}

describe("strip kernels", () => {
  for (const dt of ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k"] as const) {
    test(`${dt} every tile and slice equals reference`, () => {
      for (const n of NS[dt]!) {
        const w = weights(dt, 29, n, n);
        expectTiles(kernel([{ matrix: w, cols: n }]), w, n, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
      }
    });
  }

  test("f16 batch 1 takes the exact path for large or non-finite x", () => {
    // Scaling x by 2^112 would overflow past 2^16: those calls must still give matmulRef's bits,
    // on a small matrix (16 rows) and on 72 rows of 136 (nine strips, one after another).
    for (const [n, d] of [
      [24, 16],
      [136, 72],
    ] as const) {
      const w = weights("f16", d, n, 2);
      const k = kernel([{ matrix: w, cols: n }]);
      expectBigX(k, w, n, d, [1, 65535.9, 65536, 1e6, 3e38, Number.POSITIVE_INFINITY]);
      const x = input(1, n, 5);
      x[2] = Number.NaN;
      const y = new Float32Array(d);
      k.matmul(y, x, w, 0, 1, n, d);
      const want = new Float32Array(d);
      matmulRef(want, x, dequantize(w as PackedMatrix), 0, 1, n, d);
      for (let i = 0; i < d; i++) expect(Number.isNaN(y[i]!)).toBe(Number.isNaN(want[i]!));
    }
  });
});

describe("f16 in the shifted coding", () => {
  // Weights below 128 in magnitude (down to f16 subnormals) are placed shifted (f16-bits.ts'
  // f16Shift) and widened against 2^102 where the plain coding takes 2^112.
  const small = (d: number, n: number, seed: number): PackedMatrix =>
    castMatrix(
      new Float32Array(d * n).map((_, i) => Math.sin(i * 0.61 + seed) * (1 + (i % 7)) * 10 ** ((i % 5) - 5)),
      "f16",
      n,
    ) as PackedMatrix;

  test("every tile and slice equals reference", () => {
    for (const n of NS.f16!) {
      const w = small(29, n, n);
      const k = kernel([{ matrix: w, cols: n }]);
      expect(placedShifted(k, k.views[0]!, w, 29, n)).toBe(true);
      expectTiles(k, w, n, [1, 2, 3, 5, 8, 9]);
    }
  });

  test("batch 1 takes the exact path for large or non-finite x", () => {
    // x scaled by 2^102 stays exact below 2^26: at and past it the kernel reads plain x.
    for (const [n, d] of [
      [24, 16],
      [136, 72],
    ] as const) {
      const w = small(d, n, 2);
      const k = kernel([{ matrix: w, cols: n }]);
      expect(placedShifted(k, k.views[0]!, w, d, n)).toBe(true);
      expectBigX(k, w, n, d, [1, 65536, 2 ** 26 - 4, 2 ** 26, 1e9, 3e38, Number.POSITIVE_INFINITY]);
    }
  });

  // Shapes whose one-token chunks all walk in step (dispatch.ts' THE STREAMS), on one thread and
  // split over two, where a thread keeps the x it scaled (matmul.ts' THE SCALED X A THREAD KEEPS).
  const N16 = 256;
  const D16 = 512;

  test("a plain and a shifted matrix on one x in one dispatch each read x at their own scale", async () => {
    const shifted = small(D16, N16, 5);
    const plain = castMatrix(
      new Float32Array(D16 * N16).map((_, i) => (i === 7 ? 200 : Math.cos(i * 0.3) / 8)),
      "f16",
      N16,
    ) as PackedMatrix;
    for (const threads of [1, 2]) {
      const k = kernel(
        [
          { matrix: shifted, cols: N16 },
          { matrix: plain, cols: N16 },
        ],
        threads,
      );
      await k.ready();
      expect(placedShifted(k, k.views[0]!, shifted, D16, N16)).toBe(true);
      expect(placedShifted(k, k.views[1]!, plain, D16, N16)).toBe(false);
      const x = k.alloc(N16);
      x.set(input(1, N16, 4));
      const ys = [k.alloc(D16), k.alloc(D16), k.alloc(D16)];
      // The first thread takes the shifted job's chunks, then the plain one's, on the same x.
      k.queue(ys[0]!, x, k.views[0]!, 0, 1, N16, D16);
      k.queue(ys[1]!, x, k.views[1]!, 0, 1, N16, D16);
      k.queue(ys[2]!, x, k.views[0]!, 0, 1, N16, D16);
      k.flush();
      expect(bits(ys[0]!)).toEqual(ref(x, shifted, 0, 1, N16, D16));
      expect(bits(ys[1]!)).toEqual(ref(x, plain, 0, 1, N16, D16));
      expect(bits(ys[2]!)).toEqual(ref(x, shifted, 0, 1, N16, D16));
    }
  });

  test("an x rewritten in place between dispatches is scaled anew", async () => {
    const w = small(D16, N16, 7);
    for (const threads of [1, 2]) {
      const k = kernel([{ matrix: w, cols: N16 }], threads);
      await k.ready();
      const x = k.alloc(N16);
      const y = k.alloc(D16);
      for (let i = 0; i < 20; i++) {
        x.set(input(1, N16, i));
        k.matmul(y, x, k.views[0]!, 0, 1, N16, D16);
        expect(bits(y)).toEqual(ref(x, w, 0, 1, N16, D16));
      }
      if (threads > 1) expect(k.splitCalls).toBeGreaterThan(0);
    }
  });

  test("an x kept across another kernel's job in one dispatch is scaled anew", () => {
    // Right after construction no helper has started: the caller takes its own chunks (the first
    // f16 job's, then the bf16 job's first, which writes its scratch), then steals the last
    // job's from the back, on the same x as the first.
    const w = small(D16, N16, 9);
    const wb = weights("bf16", 96, 64, 8);
    for (let i = 0; i < 5; i++) {
      const k = kernel(
        [
          { matrix: w, cols: N16 },
          { matrix: wb, cols: 64 },
        ],
        2,
      );
      const x = k.alloc(N16);
      x.set(input(1, N16, i));
      const xb = k.alloc(2 * 64);
      xb.set(input(2, 64, 99));
      const ys = [k.alloc(D16), k.alloc(2 * 96), k.alloc(D16)];
      k.queue(ys[0]!, x, k.views[0]!, 0, 1, N16, D16);
      k.queue(ys[1]!, xb, k.views[1]!, 0, 2, 64, 96);
      k.queue(ys[2]!, x, k.views[0]!, 0, 1, N16, D16);
      k.flush();
      expect(bits(ys[0]!)).toEqual(ref(x, w, 0, 1, N16, D16));
      expect(bits(ys[1]!)).toEqual(ref(xb, wb, 0, 2, 64, 96));
      expect(bits(ys[2]!)).toEqual(ref(x, w, 0, 1, N16, D16));
    }
  });

  test("row into gives every pattern below 128 exactly", () => {
    const { k, w, rows } = expectRowsRead(Uint16Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7fff) < 0x5800));
    expect(placedShifted(k, k.views[0]!, w, rows, 64)).toBe(true);
  });
});

describe("placed matrices", () => {
  test("row into reads every row of the strips exactly", () => {
    // The embedding's lookup when the classifier shares it: every row, whole and in part.
    for (const dt of ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k"] as const) {
      for (const n of dt === "q8_0" ? [32, 64] : dt === "q4_k" || dt === "q5_k" || dt === "q6_k" ? [256, 512] : [4, 13, 40]) {
        const w = weights(dt, 19, n, 5);
        const want = w instanceof Float32Array ? w : dequantize(w);
        const k = kernel([{ matrix: w, cols: n }]);
        const view = k.views[0]!;
        expect(k.offsetOf(view)).toBeGreaterThan(0);
        expect(k.offsetOf(w)).toBe(k.offsetOf(view));
        const out = new Float32Array(n + 2);
        for (let r = 0; r < 19; r++) {
          k.rowInto(view, r * n, n, out, 1);
          expect(bits(out.subarray(1, n + 1))).toEqual(bits(want.subarray(r * n, (r + 1) * n)));
        }
        k.rowInto(view, 7 * n + 1, n - 3, out, 0);
        expect(bits(out.subarray(0, n - 3))).toEqual(bits(want.subarray(7 * n + 1, 8 * n - 2)));
      }
    }
  });

  test("row into gives every finite f16 pattern exactly", () => {
    // Zeros of both signs, every subnormal and normal: as Float16Array reads them.
    // Patterns of 128 and more among them: placed plain.
    const { k, w, rows } = expectRowsRead(Uint16Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7c00) !== 0x7c00));
    expect(placedShifted(k, k.views[0]!, w, rows, 64)).toBe(false);
  });

  test("placing refuses inf or nan 16 bit weights and q8 0 scales", () => {
    const u = new Uint16Array(16 * 8).fill(0x3c00);
    u[8 * 5 + 3] = 0x7e00;
    const f16: PackedMatrix = { dtype: "f16", cols: 8, length: u.length, bytes: new Uint8Array(u.buffer) };
    expect(() => kernel([{ matrix: f16, cols: 8 }])).toThrow(/f16 weight 43 is inf or NaN \(0x7e00\)/);
    const q = castMatrix(new Float32Array(32 * 10).fill(1), "q8_0", 32) as PackedMatrix;
    new DataView(q.bytes.buffer).setUint16(34 * 9, 0x7c00, true);
    expect(() => kernel([{ matrix: q, cols: 32 }])).toThrow(/q8_0 block 9 has an inf or NaN scale/);
  });
});

describe("dispatch", () => {
  // Big enough to be split: every dtype's kernel, batch 1 and batched, three jobs in one dispatch.
  const n = 96;
  const mats = (["f16", "bf16", "q8_0"] as const).map((dt, i) => weights(dt, 8 * 64 + 5, n, i));
  const run = (k: MatmulKernel, rows: number): number[][] => {
    const x = k.alloc(rows * n);
    x.set(input(rows, n, rows));
    const ys = mats.map(() => k.alloc(rows * 400));
    // Slices from inside a strip, of odd lengths, so every thread's cut meets partial strips.
    mats.forEach((w, j) => k.queue(ys[j]!, x, w, (3 + j * 50) * n, rows, n, 400));
    k.flush();
    return ys.map((y) => bits(y));
  };

  test("one dispatch of several matmuls equals each alone on any thread count", async () => {
    for (const rows of [1, 5]) {
      const x = input(rows, n, rows);
      const want = mats.map((w, j) => ref(x, w, (3 + j * 50) * n, rows, n, 400));
      for (const threads of [1, 2, 3]) {
        const k = kernel(
          mats.map((matrix) => ({ matrix, cols: n })),
          threads,
        );
        await k.ready();
        expect(run(k, rows)).toEqual(want);
        // A helper takes chunks once it is awake and scheduled: on a loaded machine that may take
        // a few dispatches, and every one of them must give the same bits.
        const deadline = performance.now() + 5000;
        while (threads > 1 && k.splitCalls === 0 && performance.now() < deadline) expect(run(k, rows)).toEqual(want);
        if (threads > 1) expect(k.splitCalls).toBeGreaterThan(0);
      }
    }
  });

  test("thousands of small dispatches back to back all finish and agree", async () => {
    // The helpers finish one dispatch while the caller writes the next, of another size: no
    // chunk may be taken twice or lost (either hangs the caller) and every dispatch gives the
    // same bits.
    const w = weights("bf16", 1024, 72, 9);
    for (const threads of [2, 3]) {
      const k = kernel([{ matrix: w, cols: 72 }], threads);
      await k.ready();
      const x = k.alloc(72);
      x.set(input(1, 72, 3));
      const ys = [0, 1, 2].map(() => k.alloc(1024));
      const want = ref(x, w, 0, 1, 72, 1024);
      for (let i = 0; i < 10000; i++) {
        // One job, then three: 8 chunks a job per helper, so dispatch sizes alternate.
        const jobs = i % 2 === 0 ? 1 : 3;
        for (let j = 0; j < jobs; j++) k.queue(ys[j]!, x, w, 0, 1, 72, 1024);
        k.flush();
        if (i % 1000 === 1) for (const y of ys) expect(bits(y)).toEqual(want);
      }
    }
  });

  test("a job feeding another in one dispatch is refused", () => {
    const w = weights("f32", 16, 16, 0);
    const k = kernel([{ matrix: w, cols: 16 }]);
    const a = k.alloc(16);
    const b = k.alloc(16);
    k.queue(b, a, w, 0, 1, 16, 16);
    expect(() => k.queue(a, b, w, 0, 1, 16, 16)).toThrow(/job 1's output is job 0's input/);
    const c = new Float32Array(16);
    k.flush();
    k.queue(c, a, w, 0, 1, 16, 16);
    expect(() => k.queue(b, c, w, 0, 1, 16, 16)).toThrow(/flush between them/);
    k.flush();
  });
});
