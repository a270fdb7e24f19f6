import { describe, expect, test } from "bun:test";
import { KERNELS_WASM_BASE64 } from "../../src/model/compute/kernels/kernels-wasm.ts";
import { KERNEL_RESERVED_BYTES, MatmulKernel, matmulRef } from "../../src/model/compute/matmul.ts";
import { castMatrix, dequantize, Q8_0_BLOCK_BYTES, QK8_0, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { Transformer } from "../../src/model/index.ts";
import { syntheticWeights, castWeights, MATRICES, weightsDType } from "../../src/model/compute/weights.ts";
import { Seq, TINY, bits, expectMatmulsGive, newPool, step, tokens } from "./helpers.ts";
import { placedShifted } from "./quant-helpers.ts";

/** f16 bit patterns of every kind but NaN and inf: zeros, subnormals, normals of both signs. */
function f16Matrix(d: number, n: number, seed: number): PackedMatrix {
  const u = new Uint16Array(d * n);
  let s = seed;
  for (let i = 0; i < u.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    let h = s >>> 16;
    if ((h & 0x7c00) === 0x7c00) h &= ~0x4000; // keep exponents finite
    u[i] = i % 7 === 0 ? h & 0x83ff : h; // every 7th a subnormal (or zero)
  }
  return { dtype: "f16", cols: n, length: u.length, bytes: new Uint8Array(u.buffer) };
}

function checkAgainstRef(w: PackedMatrix | Float32Array, n: number, d: number): void {
  const placed = new MatmulKernel([w]);
  // q8_0's reference is its own integer order (matmulQ8Ref), not the f32 one on a dequantized copy.
  const wf = w instanceof Float32Array || w.dtype === "q8_0" ? w : dequantize(w);
  for (const rows of [1, 2, 3, 5, 8]) {
    const x = new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.37) * 3);
    const want = new Float32Array(rows * d);
    matmulRef(want, x, wf, 0, rows, n, d);
    expectMatmulsGive(placed, x, w, { wOff: 0, rows, n, d }, want);
  }
  // A layer's slice: rows from the middle of the matrix.
  if (d >= 4) {
    const x = new Float32Array(n).map((_, i) => Math.sin(i));
    const want = new Float32Array(2);
    const got = new Float32Array(2);
    matmulRef(want, x, wf, 2 * n, 1, n, 2);
    placed.matmul(got, x, w, 2 * n, 1, n, 2);
    expect(bits(got)).toEqual(bits(want));
  }
}

describe("kernels", () => {
  test("f16 kernel equals reference on dequantized weights", () => {
    // Every n % 4 tail (the scalar f16 conversion), every strip remainder.
    for (const n of [1, 3, 4, 37, 64]) for (const d of [1, 7, 9, 17]) checkAgainstRef(f16Matrix(d, n, n * 31 + d), n, d);
  });

  test("f16 conversion is exact for every finite pattern", () => {
    // One-hot x picks single weights out: the vector path (n = 4) and the scalar tail (n = 3).
    const finite = Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7c00) !== 0x7c00);
    const lut = new Float32Array(new Float16Array(Uint16Array.from(finite).buffer));
    for (const n of [4, 3]) {
      const d = Math.ceil(finite.length / n);
      const u = new Uint16Array(d * n);
      u.set(finite);
      const w: PackedMatrix = { dtype: "f16", cols: n, length: u.length, bytes: new Uint8Array(u.buffer) };
      const x = new Float32Array(n * n);
      for (let j = 0; j < n; j++) x[j * n + j] = 1;
      const y = new Float32Array(n * d);
      new MatmulKernel([w]).matmul(y, x, w, 0, n, n, d);
      for (let k = 0; k < finite.length; k++) {
        const got = y[(k % n) * d + Math.floor(k / n)]!;
        if (!Object.is(got, lut[k]!)) expect(`f16 0x${finite[k]!.toString(16)} -> ${got}`).toBe(`f16 0x${finite[k]!.toString(16)} -> ${lut[k]}`);
      }
    }
  });

  test("f16 conversion in whole groups is exact for every finite pattern at batch 1", () => {
    // n = 8: every weight in a whole group. One token row at a time, x one-hot at j: x = 1 takes
    // the kernel on x scaled by 2^112, x = 2^16 the one on plain x (y = w * 2^16, still exact).
    const finite = Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7c00) !== 0x7c00);
    const lut = new Float32Array(new Float16Array(Uint16Array.from(finite).buffer));
    const n = 8;
    const d = finite.length / n;
    const u = Uint16Array.from(finite);
    const w: PackedMatrix = { dtype: "f16", cols: n, length: u.length, bytes: new Uint8Array(u.buffer) };
    const k = new MatmulKernel([w]);
    const y = new Float32Array(d);
    for (const one of [1, 65536]) {
      for (let j = 0; j < n; j++) {
        const x = new Float32Array(n);
        x[j] = one;
        k.matmul(y, x, k.views[0]!, 0, 1, n, d);
        for (let r = 0; r < d; r++) {
          const want = Math.fround(lut[r * n + j]! * one) + 0; // sums start at +0: -0 comes out +0
          if (!Object.is(y[r]!, want)) expect(`f16 0x${finite[r * n + j]!.toString(16)} * ${one} -> ${y[r]}`).toBe(`-> ${want}`);
        }
      }
    }
  });

  test("f16 in the shifted coding: every pattern below 128 is exact in groups, tails and batches", () => {
    // The patterns every |w| < 128 (subnormals, zeros and normals of both signs) place shifted
    // (f16-bits.ts' f16Shift). One token row at a time, x one-hot at j: x = 1 and 2^16 take the
    // kernel on x scaled by 2^102, x = 2^26 the one on plain x; two rows at a time the batch
    // path (each strip widened into scratch). n = 8 puts every weight in a whole group, n = 3
    // and 4 in the tails (a row's tail group of 4, its last n % 4 one by one).
    const held = Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7fff) < 0x5800);
    const lut = new Float32Array(new Float16Array(Uint16Array.from(held).buffer));
    for (const n of [8, 4, 3]) {
      const d = Math.ceil(held.length / n);
      const u = new Uint16Array(d * n);
      u.set(held);
      const w: PackedMatrix = { dtype: "f16", cols: n, length: u.length, bytes: new Uint8Array(u.buffer) };
      const k = new MatmulKernel([w]);
      expect(placedShifted(k, k.views[0]!, w, d, n)).toBe(true);
      for (const rows of [1, 2]) {
        for (const one of rows === 1 ? [1, 65536, 2 ** 26] : [1]) {
          const y = new Float32Array(rows * d);
          for (let j = 0; j < n; j++) {
            const x = new Float32Array(rows * n);
            for (let r = 0; r < rows; r++) x[r * n + j] = one;
            k.matmul(y, x, k.views[0]!, 0, rows, n, d);
            for (let r = 0; r < d && r * n + j < held.length; r++) {
              const want = Math.fround(lut[r * n + j]! * one) + 0; // sums start at +0: -0 comes out +0
              for (let t = 0; t < rows; t++) {
                if (!Object.is(y[t * d + r]!, want)) expect(`n ${n} f16 0x${held[r * n + j]!.toString(16)} * ${one} -> ${y[t * d + r]}`).toBe(`-> ${want}`);
              }
            }
          }
        }
      }
    }
  });

  test("f16 inf or nan weights are refused", () => {
    const u = new Uint16Array([0x3c00, 0x7c00, 0, 0]);
    const w: PackedMatrix = { dtype: "f16", cols: 4, length: 4, bytes: new Uint8Array(u.buffer) };
    expect(() => new MatmulKernel([w])).toThrow(/f16 weight 1 is inf or NaN/);
  });

  test("bf16 kernel equals reference on dequantized weights", () => {
    for (const n of [3, 4, 37, 64]) {
      for (const d of [1, 9, 17]) {
        const f = new Float32Array(d * n).map((_, i) => Math.sin(i * 1.3) * 10 ** ((i % 9) - 4));
        const m = castMatrix(f, "bf16", n) as PackedMatrix;
        expect(m.bytes.byteLength).toBe(2 * d * n);
        checkAgainstRef(m, n, d);
      }
    }
  });

  test("q8 0 kernel equals its integer reference", () => {
    for (const n of [32, 64, 96, 288]) {
      for (const d of [1, 8, 9, 17]) {
        const f = new Float32Array(d * n).map((_, i) => Math.sin(i * 0.7) * (1 + (i % 5)));
        const m = castMatrix(f, "q8_0", n) as PackedMatrix;
        expect(m.bytes.byteLength).toBe((d * n * Q8_0_BLOCK_BYTES) / QK8_0);
        checkAgainstRef(m, n, d);
      }
    }
  });

  test("f32 kernel equals reference", () => {
    for (const n of [5, 32, 288])
      for (const d of [3, 16, 33])
        checkAgainstRef(
          new Float32Array(d * n).map((_, i) => Math.cos(i * 0.9)),
          n,
          d,
        );
  });

  test("q8 0 layout is ggml block", () => {
    // One block: the f16 scale max|x| / 127 first, then round(x / scale) as int8.
    const x = new Float32Array(32).map((_, i) => (i - 10) * 0.5);
    const m = castMatrix(x, "q8_0", 32) as PackedMatrix;
    const dv = new DataView(m.bytes.buffer);
    const scale = dv.getFloat16(0, true);
    expect(scale).toBe(Math.f16round(10.5 / 127));
    const want = Math.fround(1 / Math.fround(10.5 / 127));
    for (let j = 0; j < 32; j++) {
      const v = Math.fround(x[j]! * want);
      expect(dv.getInt8(2 + j)).toBe(Math.sign(v) * Math.round(Math.abs(v)));
    }
    expect(dv.getInt8(2 + 31)).toBe(127);
    const back = dequantize(m);
    for (let j = 0; j < 32; j++) expect(Math.abs(back[j]! - x[j]!)).toBeLessThanOrEqual(scale / 2 + 1e-6);
  });

  test("q8 0 rejects rows that are not whole blocks", () => {
    expect(() => castMatrix(new Float32Array(40), "q8_0", 40)).toThrow(/whole blocks of 32/);
  });

  test("f16 and bf16 round to nearest even", () => {
    const x = new Float32Array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0, 65504]);
    const h = dequantize(castMatrix(x, "f16", 1) as PackedMatrix);
    expect([...h]).toEqual([1, 1 + 2 ** -9, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0, 65504]);
    const b = dequantize(castMatrix(x, "bf16", 1) as PackedMatrix);
    expect([...b.subarray(0, 4)]).toEqual([1, 1, 1, 1 + 2 ** -6]);
  });
});

describe("packed weights in the transformer", () => {
  test("packed model equals f32 model of its dequantized weights and q8 0 is near it", () => {
    // TINY's rows (32, 64) are whole q8_0 blocks; a shared classifier stays shared when packed.
    for (const dtype of ["f16", "bf16", "q8_0"] as const) {
      for (const shared of [false, true]) {
        const w = castWeights(TINY, syntheticWeights(TINY, 11, { sharedClassifier: shared }), dtype);
        expect(weightsDType(w)).toBe(dtype);
        expect(w.wcls === w.tokenEmbedding).toBe(shared);
        const asF32 = { ...w };
        for (const k of MATRICES) asF32[k] = dequantize(w[k] as PackedMatrix);
        const prompt = tokens(13, 5);
        const a = step(new Transformer(TINY, w), new Seq(newPool()), prompt);
        const b = step(new Transformer(TINY, asF32), new Seq(newPool()), prompt);
        if (dtype !== "q8_0") expect(bits(a)).toEqual(bits(b));
        else {
          // q8_0 also quantizes x (ggml's q8_0 x q8_0), so it is near its dequantized model, not equal.
          const err = Math.max(...a.map((v, i) => Math.abs(v - b[i]!)));
          const scale = Math.max(...b.map(Math.abs));
          expect(err).toBeGreaterThan(0);
          expect(err).toBeLessThan(0.02 * scale);
        }
      }
    }
  });
});

describe("kernel module", () => {
  test("static data stays inside the reserved bytes", () => {
    // Every instantiation (each helper thread's too) writes the data segments into the shared
    // memory: they must end before the first placed weight.
    const b = Uint8Array.from(atob(KERNELS_WASM_BASE64), (c) => c.charCodeAt(0));
    let i = 8;
    const leb = (): number => {
      let n = 0;
      for (let sh = 0; ; sh += 7) {
        const c = b[i++]!;
        n |= (c & 0x7f) << sh;
        if (c < 0x80) return n;
      }
    };
    let end = 0;
    while (i < b.length) {
      const id = b[i++]!;
      const size = leb();
      const next = i + size;
      if (id === 11) {
        for (let count = leb(); count > 0; count--) {
          expect(leb()).toBe(0); // an active segment of memory 0
          expect(b[i++]).toBe(0x41); // i32.const offset
          const at = leb();
          expect(b[i++]).toBe(0x0b);
          const len = leb();
          end = Math.max(end, at + len);
          i += len;
        }
      }
      i = next;
    }
    // The kernels may carry no static data at all (exp is computed, not tabled): end is then 0.
    expect(end).toBeLessThanOrEqual(KERNEL_RESERVED_BYTES);
  });
});

describe("kernel memory", () => {
  test("allocZeroed gives zero bytes where per-call copies wrote before", () => {
    const k = new MatmulKernel();
    // A matmul on arrays outside the memory copies x and y in above the top: non-zero bytes there.
    const x = new Float32Array(64 * 64).fill(3);
    const w = new Float32Array(64 * 64).fill(2);
    k.matmul(new Float32Array(64 * 64), x, w, 0, 64, 64, 64);
    const a = k.allocZeroed(3 * 64 * 64 * 4)!;
    expect(a.every((b) => b === 0)).toBe(true);
    expect(k.addressOf(a)).toBeGreaterThan(0);
  });
});
