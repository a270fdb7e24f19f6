import { afterAll, describe, expect, test } from "bun:test";
import { MatmulKernel, matmulQ8Ref, matmulRef } from "../../src/model/compute/matmul.ts";
import { castMatrix, dequantize, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { bits, expectSlices } from "./helpers.ts";

// The integer q8_0 kernel (kernels/assembly/q8.ts) against matmulQ8Ref, bit for bit: x's
// quantization at its edges (zero blocks, ties, NaN, huge and tiny values), every tile and tail,
// and each output depending only on its own token row, whatever the batch, dispatch or thread.

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

function kernel(ms: PackedMatrix[], n: number, threads = 1): MatmulKernel {
  const k = new MatmulKernel(
    ms.map((matrix) => ({ matrix, cols: n })),
    { threads },
  );
  kernels.push(k);
  return k;
}

function weights(d: number, n: number, seed: number): PackedMatrix {
  const f = new Float32Array(d * n).map((_, i) => Math.sin(i * 0.61 + seed) * (1 + (i % 7)) * 10 ** ((i % 5) - 2));
  return castMatrix(f, "q8_0", n) as PackedMatrix;
}

function input(rows: number, n: number, seed: number): Float32Array {
  return new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37 + seed) * 3);
}

function ref(x: Float32Array, w: PackedMatrix, wOff: number, rows: number, n: number, d: number): number[] {
  const y = new Float32Array(rows * d);
  matmulQ8Ref(y, x, w, wOff, rows, n, d);
  return bits(y);
}

describe("q8_0 integer kernel", () => {
  test("matmul ref of a q8 0 matrix is the integer order", () => {
    // The fallback (matmulRef) and the kernel's oracle are one function; the integer order is not
    // the f32 one on the dequantized copy, but near it.
    const n = 96;
    const w = weights(13, n, 1);
    const x = input(3, n, 2);
    const y = new Float32Array(3 * 13);
    matmulRef(y, x, w, 0, 3, n, 13);
    expect(bits(y)).toEqual(ref(x, w, 0, 3, n, 13));
    const f = new Float32Array(3 * 13);
    matmulRef(f, x, dequantize(w), 0, 3, n, 13);
    expect(bits(f)).not.toEqual(bits(y));
    for (let i = 0; i < f.length; i++) expect(Math.abs(f[i]! - y[i]!)).toBeLessThan(0.02 * Math.max(...f.map(Math.abs)));
  });

  test("x quantization edges give the reference bits", () => {
    const n = 64;
    const w = weights(24, n, 3);
    const k = kernel([w], n);
    const cases: [string, (x: Float32Array) => void][] = [
      ["a zero block", (x) => x.fill(0, 0, 32)],
      ["a block of -0", (x) => x.fill(-0, 32, 64)],
      // max 127 and x = 0.5, 1.5, 2.5: ties of x / s, which go to even.
      ["ties", (x) => x.set([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], 0)],
      ["a NaN", (x) => (x[40] = Number.NaN)],
      ["an infinity", (x) => (x[3] = Number.POSITIVE_INFINITY)],
      ["huge values", (x) => x.fill(3e38, 0, 16)],
      ["subnormal values", (x) => x.fill(1e-44, 32, 64)],
      ["one subnormal beside zeros", (x) => (x.fill(0, 0, 32), (x[7] = -3e-45))],
      // s = max / 127 is a nonzero subnormal whose inverse overflows to inf: q saturates (0 * inf is NaN, so 0).
      ["a scale whose inverse overflows", (x) => (x.fill(1e-37, 0, 32), (x[5] = 0), (x[6] = -5e-38))],
    ];
    for (const [name, edit] of cases) {
      for (const rows of [1, 5]) {
        const x = input(rows, n, 7);
        edit(x);
        const y = new Float32Array(rows * 24);
        k.matmul(y, x, w, 0, rows, n, 24);
        expect([name, bits(y)]).toEqual([name, ref(x, w, 0, rows, n, 24)]);
      }
    }
  });

  test("every tile tail and slice equals reference", () => {
    for (const n of [32, 64, 288]) {
      // 37 rows: four whole strips and a padded fifth.
      const w = weights(37, n, n);
      const k = kernel([w], n);
      const slices = [
        [0, 37],
        [8, 24],
        [3, 9],
        [5, 1],
        [11, 26],
        [32, 5],
      ] as const;
      expectSlices(k, w, n, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], slices, input, ref);
    }
  });

  test("a row gives the same bits alone and in any batch", () => {
    // Prefill (many rows, the 4x4 tiles) and decode (one row, the strip) of one token must agree.
    const n = 96;
    const w = weights(40, n, 5);
    const k = kernel([w], n);
    const x = input(9, n, 3);
    const alone = [...Array(9).keys()].map((r) => {
      const y = new Float32Array(40);
      k.matmul(y, x.subarray(r * n, (r + 1) * n), w, 0, 1, n, 40);
      return bits(y);
    });
    for (const [from, rows] of [
      [0, 9],
      [1, 4],
      [2, 7],
      [5, 3],
    ] as const) {
      const y = new Float32Array(rows * 40);
      k.matmul(y, x.subarray(from * n, (from + rows) * n), w, 0, rows, n, 40);
      for (let r = 0; r < rows; r++) expect(bits(y.subarray(r * 40, (r + 1) * 40))).toEqual(alone[from + r]!);
    }
  });

  test("a prefill sized batch gives each row its decode bits", () => {
    // 8x2 tiles over 117 rows (the odd one by strip8), against the reference and each row alone.
    const n = 288;
    const rows = 117;
    const w = weights(21, n, 8);
    const k = kernel([w], n);
    const x = input(rows, n, 4);
    x.fill(0, 5 * n, 6 * n);
    x[7 * n + 3] = Number.NaN;
    const y = new Float32Array(rows * 21);
    k.matmul(y, x, w, 0, rows, n, 21);
    expect(bits(y)).toEqual(ref(x, w, 0, rows, n, 21));
    for (const r of [0, 5, 7, 116]) {
      const one = new Float32Array(21);
      k.matmul(one, x.subarray(r * n, (r + 1) * n), w, 0, 1, n, 21);
      expect(bits(one)).toEqual(bits(y.subarray(r * 21, (r + 1) * 21)));
    }
  });

  test("four token tiles and their leftovers give each row its reference and decode bits", () => {
    // 8x4 tiles eight tokens a block (tiles8x4), then four, then 8x2, then strip8: every count of
    // rows 1..9, 12-15 (eight and then four) and 17, whole and padded strips.
    for (const n of [64, 288]) {
      const w = weights(8 * 3 + 5, n, n + 1);
      const k = kernel([w], n);
      for (const rows of [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 17]) {
        const x = input(rows, n, rows + 20);
        for (const [r0, d] of [
          [0, 29],
          [8, 16],
        ] as const) {
          const y = new Float32Array(rows * d);
          k.matmul(y, x, w, r0 * n, rows, n, d);
          expect(bits(y)).toEqual(ref(x, w, r0 * n, rows, n, d));
          for (const r of [0, rows - 1]) {
            const one = new Float32Array(d);
            k.matmul(one, x.subarray(r * n, (r + 1) * n), w, r0 * n, 1, n, d);
            expect(bits(one)).toEqual(bits(y.subarray(r * d, (r + 1) * d)));
          }
        }
      }
    }
  });

  test("quantized x: any split of the rows writes the bytes of one call over them all", () => {
    // A row's place depends on how many rows there are (QUANTIZED X: quads, then the rows alone),
    // not on which call writes it: the threads' chunks of a prefill may cut a quad anywhere.
    const n = 64;
    const k = kernel([weights(8, n, 5)], n);
    const ex = k.exports!;
    for (const rows of [1, 3, 4, 7, 9, 13]) {
      const bytes = rows * ex.q8_row_bytes(n);
      const x = k.alloc(rows * n);
      x.set(input(rows, n, rows + 40));
      const whole = k.alloc(bytes / 4);
      const parts = k.alloc(bytes / 4);
      const at = (a: Float32Array) => a.byteOffset;
      ex.quantize_rows(at(whole), at(x), 1, n, 0, rows, rows);
      for (let r0 = 0; r0 < rows; r0 += 3) ex.quantize_rows(at(parts), at(x), 1, n, r0, Math.min(rows, r0 + 3), rows);
      expect(bits(parts)).toEqual(bits(whole));
    }
  });

  test("jobs sharing an x in one dispatch and jobs with their own on any thread count", async () => {
    // q, k, v share x (quantized once); a fourth job has its own x of the same shape.
    const n = 96;
    const ws = [0, 1, 2, 3].map((i) => weights(8 * 40 + 3, n, i));
    for (const threads of [1, 2, 3]) {
      const k = kernel(ws, n, threads);
      await k.ready();
      for (const rows of [1, 6]) {
        const x = k.alloc(rows * n);
        x.set(input(rows, n, rows));
        const other = k.alloc(rows * n);
        other.set(input(rows, n, rows + 10));
        const ys = ws.map(() => k.alloc(rows * 300));
        const xs = [x, x, x, other];
        const want = ws.map((w, j) => ref(xs[j]!, w, (1 + j) * n, rows, n, 300));
        const once = (): number[][] => {
          ws.forEach((w, j) => k.queue(ys[j]!, xs[j]!, w, (1 + j) * n, rows, n, 300));
          k.flush();
          return ys.map((y) => bits(y));
        };
        expect(once()).toEqual(want);
        const deadline = performance.now() + 5000;
        while (threads > 1 && k.splitCalls === 0 && performance.now() < deadline) expect(once()).toEqual(want);
        if (threads > 1) expect(k.splitCalls).toBeGreaterThan(0);
      }
    }
  });
});
