import { afterAll, describe, expect, test } from "bun:test";
import { f16Bits } from "../../src/model/compute/f16-bits.ts";
import { controlBytes, J_PLACE, KERNEL_INDEX, KernelThreads } from "../../src/model/compute/kernel-threads.ts";
import { J_D, J_FN, J_N, J_ROWS, J_W, J_X, J_Y, JOB_INTS, type KernelExports } from "../../src/model/compute/kernel-exports.ts";
import { kBlockBytes } from "../../src/model/compute/k-quants.ts";
import { legacyShape } from "../../src/model/compute/legacy-quants.ts";
import { kernelModule, MatmulKernel } from "../../src/model/compute/matmul.ts";
import { blockElems, type DType, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { packStrips, stripBytes, stripLayoutBytes } from "../../src/model/compute/strip-layout.ts";
import { blockScale, randomBytes } from "./quant-helpers.ts";

// kernels/assembly/place-quant.ts against the plain-JS packers it replaces at load
// (k-quant-strips.ts' packKStrip, legacy-strips.ts' packLegacyStrip, reached through
// strip-layout.ts' packStrips without the kernels): the same bytes, strip for strip, on ggml
// blocks of random bits, for row counts that are and are not whole strips, whatever the split of
// the rows into chunks, the order the chunks run in, the thread count and the stage size.

type QType = "q4_k" | "q5_k" | "q6_k" | "q4_0" | "q4_1" | "q5_0" | "q5_1";
const TYPES: QType[] = ["q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1"];

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

function blockBytesOf(dt: QType): number {
  return dt === "q4_k" || dt === "q5_k" || dt === "q6_k" ? kBlockBytes(dt) : legacyShape(dt).bytes;
}

/** rows x n of random ggml blocks: every bit random but the f16 scales (d, and dmin or m), finite. */
const isKType = (dt: QType): boolean => dt === "q4_k" || dt === "q5_k" || dt === "q6_k";
/** Where a block's d sits: q6_k's last, the others' first. */
const dAt = (dt: QType): number => (dt === "q6_k" ? 208 : 0);
function randomBlocks(dt: QType, rows: number, n: number, seed: number): PackedMatrix {
  const bb = blockBytesOf(dt);
  const bytes = randomBytes((rows * n * bb) / blockElems(dt), seed);
  const dv = new DataView(bytes.buffer);
  const two = dt === "q4_k" || dt === "q5_k" || dt === "q4_1" || dt === "q5_1";
  for (let at = 0, b = 0; at < bytes.length; at += bb, b++) {
    dv.setUint16(at + dAt(dt), f16Bits(blockScale(b)), true);
    if (two) dv.setUint16(at + 2, f16Bits(Math.abs(blockScale(b + 1)) * 0.7), true);
  }
  return { dtype: dt, cols: n, length: rows * n, bytes };
}

/** The JS packers' strips of m (rows of n). */
function reference(m: PackedMatrix, rows: number, n: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(stripLayoutBytes(m.dtype as DType, rows, n));
  packStrips(m, 0, rows, n, out, 0);
  return out;
}

/** The kernel module on a memory of its own, for calling place_quant_rows directly. */
function bareKernel(bytes: number): { ex: KernelExports; u8: Uint8Array; memory: WebAssembly.Memory } {
  const pages = Math.ceil(bytes / 65536) + 20;
  const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: true });
  const ex = new WebAssembly.Instance(kernelModule()!, { env: { memory } }).exports as unknown as KernelExports;
  return { ex, u8: new Uint8Array(memory.buffer), memory };
}

const SHAPES: Record<"k" | "legacy", [number, number][]> = {
  // rows x n: one row, a partial strip, whole strips, odd counts past them.
  k: [
    [1, 256],
    [5, 512],
    [8, 256],
    [13, 768],
    [27, 256],
    [40, 512],
  ],
  legacy: [
    [1, 32],
    [3, 96],
    [8, 64],
    [13, 160],
    [29, 32],
    [41, 256],
  ],
};

describe("place-quant.ts: K-quant and legacy blocks placed by the kernels", () => {
  for (const dt of TYPES) {
    const shapes = SHAPES[isKType(dt) ? "k" : "legacy"];

    test(`${dt}: the kernel's strips are the JS packer's, over any dirty destination and any split of the rows`, () => {
      const fn = KERNEL_INDEX[dt];
      for (const [rows, n] of shapes) {
        const m = randomBlocks(dt, rows, n, rows * 31 + n);
        const want = reference(m, rows, n);
        const { ex, u8 } = bareKernel(m.bytes.length + want.length + 4096);
        expect(ex.places_quant(fn)).toBe(1);
        const src = 1024;
        const dst = src + ((m.bytes.length + 15) & ~15);
        u8.set(m.bytes, src);
        // Chunks of 8, 16 and all rows, run back to front: each writes its own strips whole.
        for (const per of [8, 16, Math.ceil(rows / 8) * 8]) {
          u8.fill(0xa5, dst, dst + want.length);
          for (let g0 = Math.floor((rows - 1) / per) * per; g0 >= 0; g0 -= per) ex.place_quant_rows(dst, src, fn, n, rows, g0, Math.min(rows, g0 + per));
          expect(new Uint8Array(u8.subarray(dst, dst + want.length))).toEqual(want);
        }
      }
    });

    test(`${dt}: MatmulKernel places the JS packer's bytes on 1, 2 and 3 threads, a few rows staged at a time`, () => {
      // 83 rows of 2048: a stage of 8 rows stays on the caller, 40 rows and the whole are shared.
      const [rows, n] = [83, 2048];
      const m = randomBlocks(dt, rows, n, 5);
      const want = reference(m, rows, n);
      const rowBytes = m.bytes.length / rows;
      for (const threads of [1, 2, 3]) {
        for (const stage of [8 * rowBytes, 40 * rowBytes, 1 << 22]) {
          const k = new MatmulKernel([{ matrix: m, cols: n }], { threads, placeStageBytes: stage });
          kernels.push(k);
          const at = k.offsetOf(k.views[0]!);
          expect(new Uint8Array(new Uint8Array(k.memory!.buffer, at, want.length))).toEqual(want);
          expect(stripBytes(dt, n) * Math.ceil(rows / 8)).toBe(want.length);
        }
      }
    });

    test(`${dt}: a block with an inf or NaN scale past the first stage is refused, naming it`, () => {
      const n = isKType(dt) ? 256 : 32;
      const m = randomBlocks(dt, 40, n, 9);
      const bb = blockBytesOf(dt);
      const bad = 37 * (n / blockElems(dt));
      // The high byte of dmin or m where the block has one, else of d.
      const two = dt === "q4_k" || dt === "q5_k" || dt === "q4_1" || dt === "q5_1";
      m.bytes[bad * bb + dAt(dt) + (two ? 3 : 1)] = 0x7c;
      const mk = () => new MatmulKernel([{ matrix: m, cols: n }], { threads: 2, placeStageBytes: 8 * bb * (n / blockElems(dt)) });
      expect(mk).toThrow(new RegExp(`^${dt} block ${bad} has an inf or NaN scale \\(0x7c[0-9a-f]{2}\\)$`));
    });
  }

  test("PLACE jobs run on the helper threads too, and give the same bytes", async () => {
    // The helpers of a MatmulKernel start while it places (whether they join a small load is a
    // race): here they are up first, so every dispatch is theirs to share.
    const [rows, n] = [203, 2048];
    const m = randomBlocks("q4_k", rows, n, 3);
    const want = reference(m, rows, n);
    const ctrl = 4096;
    const jobsAt = ctrl + controlBytes(2) + 64;
    const src = jobsAt + 64;
    const dst = src + ((m.bytes.length + 15) & ~15);
    const { ex, u8, memory } = bareKernel(dst + want.length);
    const threads = new KernelThreads(kernelModule()!, memory, 2, ctrl);
    try {
      await threads.ready;
      u8.set(m.bytes, src);
      const j = new Int32Array(memory.buffer, jobsAt, JOB_INTS);
      const per = 96;
      // A helper that sleeps between dispatches may miss a few: run the load until one joined.
      for (let round = 0; round < 200 && (round === 0 || threads.helperChunks === 0); round++) {
        u8.fill(0xa5, dst, dst + want.length);
        for (let r = 0; r < rows; r += per) {
          j.fill(0);
          j[J_FN] = J_PLACE;
          j[J_Y] = dst + (r / 8) * stripBytes("q4_k", n);
          j[J_X] = src + r * (m.bytes.length / rows);
          j[J_W] = KERNEL_INDEX.q4_k;
          j[J_ROWS] = 1;
          j[J_N] = n;
          j[J_D] = Math.min(per, rows - r);
          threads.run(ex, j, 1, 0, 0);
        }
        expect(new Uint8Array(u8.subarray(dst, dst + want.length))).toEqual(want);
      }
      expect(threads.helperChunks).toBeGreaterThan(0);
    } finally {
      threads.close();
    }
  });

  test("the progress line is told each stage as it is placed, and every matrix whole", () => {
    const m = randomBlocks("q4_k", 100, 512, 4);
    const f16: PackedMatrix = { dtype: "f16", cols: 64, length: 64 * 64, bytes: new Uint8Array(64 * 64 * 2) };
    const told: number[] = [];
    const rowBytes = m.bytes.length / 100;
    const k = new MatmulKernel(
      [
        { matrix: m, cols: 512 },
        { matrix: f16, cols: 64 },
      ],
      { threads: 2, placeStageBytes: 32 * rowBytes, placing: { add: (b) => told.push(b) } },
    );
    kernels.push(k);
    // 100 rows 32 at a time: 32, 32, 32, 4 rows (then 0 left of the matrix); the f16 matrix whole.
    expect(told).toEqual([32 * rowBytes, 32 * rowBytes, 32 * rowBytes, 4 * rowBytes, 0, f16.bytes.length]);
  });

  test("the kernels place every K-quant and legacy dtype, and no other", () => {
    const { ex } = bareKernel(0);
    for (const dt of TYPES) expect(ex.places_quant(KERNEL_INDEX[dt])).toBe(1);
    for (const dt of ["f32", "f16", "bf16", "q8_0"] as const) expect(ex.places_quant(KERNEL_INDEX[dt])).toBe(0);
  });
});
