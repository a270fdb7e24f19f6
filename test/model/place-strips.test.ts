import { afterAll, describe, expect, test } from "bun:test";
import { f16Bits, f16Shift, f16Unshift, f16Values } from "../../src/model/compute/f16-bits.ts";
import { controlBytes, F16_SHIFTED, J_PLACE, J_TOUCH, KERNEL_INDEX, KernelThreads, writeTouchJob } from "../../src/model/compute/kernel-threads.ts";
import { J_D, J_FN, J_N, J_ROWS, J_W, J_X, J_Y, JOB_INTS, type KernelExports } from "../../src/model/compute/kernel-exports.ts";
import { kBlockBytes } from "../../src/model/compute/k-quants.ts";
import { legacyShape } from "../../src/model/compute/legacy-quants.ts";
import { kernelModule, MatmulKernel, matmulRef } from "../../src/model/compute/matmul.ts";
import { blockElems, type DType, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { packStrips, stripBytes, stripLayoutBytes } from "../../src/model/compute/strip-layout.ts";
import { blockScale, placedShifted, randomBytes, shiftedStrips } from "./quant-helpers.ts";

// kernels/assembly/place-strips.ts against the plain-JS packers it replaces at load
// (strip-layout.ts' packU16 and packQ8, k-quant-strips.ts' packKStrip, legacy-strips.ts'
// packLegacyStrip, all reached through packStrips without the kernels): the same bytes, strip for
// strip, on rows of random bits, for row counts that are and are not whole strips (and 16-bit
// rows with and without a tail past their groups), whatever the split of the rows into chunks,
// the order the chunks run in, the thread count and the stage size.

type PType = "f16" | "bf16" | "q8_0" | "q4_k" | "q5_k" | "q6_k" | "q4_0" | "q4_1" | "q5_0" | "q5_1";
const TYPES: PType[] = ["f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1"];

const kernels: MatmulKernel[] = [];
afterAll(() => kernels.forEach((k) => k.close()));

const isKType = (dt: PType): boolean => dt === "q4_k" || dt === "q5_k" || dt === "q6_k";
const is16 = (dt: PType): boolean => dt === "f16" || dt === "bf16";
/** Blocks with a second f16 scale (dmin or m) after d. */
const hasTwo = (dt: PType): boolean => dt === "q4_k" || dt === "q5_k" || dt === "q4_1" || dt === "q5_1";
/** Where a block's d sits: q6_k's last, the others' first. */
const dAt = (dt: PType): number => (dt === "q6_k" ? 208 : 0);

function blockBytesOf(dt: PType): number {
  if (is16(dt)) return 2;
  if (dt === "q8_0") return 34;
  return isKType(dt) ? kBlockBytes(dt as "q4_k") : legacyShape(dt as "q4_0").bytes;
}

/** rows x n of random bits: f16 weights and the blocks' f16 scales (d, and dmin or m) finite. */
function randomRows(dt: PType, rows: number, n: number, seed: number): PackedMatrix {
  const bb = blockBytesOf(dt);
  const bytes = randomBytes((rows * n * bb) / blockElems(dt), seed);
  const dv = new DataView(bytes.buffer);
  for (let at = 0, b = 0; at < bytes.length; at += bb, b++) {
    // An f16 weight with bit 14 clear has an exponent below 31: finite.
    if (dt === "f16") dv.setUint16(at, dv.getUint16(at, true) & 0xbfff, true);
    else if (dt !== "bf16") dv.setUint16(at + dAt(dt), f16Bits(blockScale(b)), true);
    if (hasTwo(dt)) dv.setUint16(at + 2, f16Bits(Math.abs(blockScale(b + 1)) * 0.7), true);
  }
  return { dtype: dt, cols: n, length: rows * n, bytes };
}

/** The JS packers' strips of m (rows of n). */
function reference(m: PackedMatrix, rows: number, n: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(stripLayoutBytes(m.dtype as DType, rows, n));
  packStrips(m, 0, rows, n, out, 0);
  return out;
}

/** The kernel module on a memory of its own, for calling place_rows directly. */
function bareKernel(bytes: number): { ex: KernelExports; u8: Uint8Array; memory: WebAssembly.Memory } {
  const pages = Math.ceil(bytes / 65536) + 20;
  const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: true });
  const ex = new WebAssembly.Instance(kernelModule()!, { env: { memory } }).exports as unknown as KernelExports;
  return { ex, u8: new Uint8Array(memory.buffer), memory };
}

const SHAPES: Record<"u16" | "q8" | "k" | "legacy", [number, number][]> = {
  // rows x n: one row, a partial strip, whole strips, odd counts past them; 16-bit rows with a tail.
  u16: [
    [1, 8],
    [3, 13],
    [8, 64],
    [13, 100],
    [27, 5],
    [40, 136],
  ],
  q8: [
    [1, 32],
    [5, 96],
    [8, 64],
    [13, 160],
    [41, 32],
  ],
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

/** Rows of a matrix in the per-thread test: 2048 columns of blocks, 2048 + 5 of 16-bit weights (a tail). */
const wideCols = (dt: PType): number => (is16(dt) ? 2053 : 2048);

describe("place-strips.ts: every dtype but f32 placed by the kernels", () => {
  for (const dt of TYPES) {
    const shapes = SHAPES[is16(dt) ? "u16" : dt === "q8_0" ? "q8" : isKType(dt) ? "k" : "legacy"];

    test(`${dt}: the kernel's strips are the JS packer's, over any dirty destination and any split of the rows`, () => {
      const fn = KERNEL_INDEX[dt];
      for (const [rows, n] of shapes) {
        const m = randomRows(dt, rows, n, rows * 31 + n);
        const want = reference(m, rows, n);
        const { ex, u8 } = bareKernel(m.bytes.length + want.length + 4096);
        expect(ex.places(fn)).toBe(1);
        const src = 1024;
        const dst = src + ((m.bytes.length + 15) & ~15);
        u8.set(m.bytes, src);
        // Chunks of 8, 16 and all rows, run back to front: each writes its own strips whole.
        for (const per of [8, 16, Math.ceil(rows / 8) * 8]) {
          u8.fill(0xa5, dst, dst + want.length);
          for (let g0 = Math.floor((rows - 1) / per) * per; g0 >= 0; g0 -= per) ex.place_rows(dst, src, fn, n, rows, g0, Math.min(rows, g0 + per));
          expect(new Uint8Array(u8.subarray(dst, dst + want.length))).toEqual(want);
        }
      }
    });

    test(`${dt}: MatmulKernel places the JS packer's bytes on 1, 2 and 3 threads, a few rows staged at a time`, () => {
      // 83 rows of about 2048: a stage of 8 rows stays on the caller, 40 rows and the whole are shared.
      const [rows, n] = [83, wideCols(dt)];
      const m = randomRows(dt, rows, n, 5);
      // f16 weights all below 2 in magnitude: placed in the shifted coding.
      const want = dt === "f16" ? shiftedStrips(m, rows, n) : reference(m, rows, n);
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

    if (dt !== "bf16") {
      test(`${dt}: an inf or NaN ${dt === "f16" ? "weight" : "scale"} past the first stage is refused, naming it`, () => {
        // Rows 32 .. 63, the second stage, are read while the helpers place the first (a split
        // dispatch: 32 rows of 2048 weights); the bad block is in row 37.
        const n = wideCols(dt);
        const m = randomRows(dt, 70, n, 9);
        const bb = blockBytesOf(dt);
        const bad = 37 * (n / blockElems(dt)) + (dt === "f16" ? 5 : 0);
        // The high byte of dmin or m where the block has one, else of d (f16: of the weight).
        m.bytes[bad * bb + dAt(dt) + (hasTwo(dt) ? 3 : 1)] = 0x7c;
        const mk = () => new MatmulKernel([{ matrix: m, cols: n }], { threads: 2, placeStageBytes: 32 * bb * (n / blockElems(dt)) });
        const what = dt === "f16" ? `f16 weight ${bad} is inf or NaN` : `${dt} block ${bad} has an inf or NaN scale`;
        expect(mk).toThrow(new RegExp(`^${what} \\(0x7c[0-9a-f]{2}\\)$`));
      });
    }
  }

  test("f16 in the shifted coding: the kernel's strips are the JS packer's of f16Shift's patterns", () => {
    for (const [rows, n] of SHAPES.u16) {
      const m = randomRows("f16", rows, n, rows * 17 + n);
      const want = shiftedStrips(m, rows, n);
      const { ex, u8 } = bareKernel(m.bytes.length + want.length + 4096);
      expect(ex.places(F16_SHIFTED)).toBe(1);
      expect(ex.first_bad(1024, F16_SHIFTED, 0)).toBe(-1);
      const src = 1024;
      const dst = src + ((m.bytes.length + 15) & ~15);
      u8.set(m.bytes, src);
      expect(ex.first_bad(src, F16_SHIFTED, rows * n)).toBe(-1);
      for (const per of [8, Math.ceil(rows / 8) * 8]) {
        u8.fill(0xa5, dst, dst + want.length);
        for (let g0 = 0; g0 < rows; g0 += per) ex.place_rows(dst, src, F16_SHIFTED, n, rows, g0, Math.min(rows, g0 + per));
        expect(new Uint8Array(u8.subarray(dst, dst + want.length))).toEqual(want);
      }
    }
  });

  test("f16Shift holds every f16 below 128 exactly, and the kernel's shift is the same on every one", () => {
    // Every pattern with |w| < 128, both signs, subnormals and zeros among them: the shifted
    // pattern's value 2^(field - 25) (1 + m / 1024), its undoing, and place_rows' coding of it
    // (its lane-by-lane path where a group holds a subnormal, its vector path elsewhere).
    const lut = f16Values();
    const held = Uint16Array.from({ length: 65536 }, (_, h) => h).filter((h) => (h & 0x7fff) < 0x5800);
    expect(held.length).toBe(2 * 0x5800);
    for (const h of held) {
      const s = f16Shift(h);
      const e = (s >> 10) & 0x1f;
      const v = e === 0 ? 0 : 2 ** (e - 25) * (1 + (s & 0x3ff) / 1024);
      const want = lut[h]!;
      if ((s & 0x8000 ? -v : v) !== want || (e === 0 && (s & 0x3ff) !== 0) || f16Unshift(s) !== h) {
        expect(`0x${h.toString(16)} -> 0x${s.toString(16)}`).toBe(`a pattern of ${want}`);
      }
    }
    const n = 8;
    const m: PackedMatrix = { dtype: "f16", cols: n, length: held.length, bytes: new Uint8Array(held.slice().buffer) };
    const rows = held.length / n;
    const want = shiftedStrips(m, rows, n);
    const { ex, u8 } = bareKernel(m.bytes.length + want.length + 4096);
    const src = 1024;
    const dst = src + m.bytes.length;
    u8.set(m.bytes, src);
    ex.place_rows(dst, src, F16_SHIFTED, n, rows, 0, rows);
    expect(new Uint8Array(u8.subarray(dst, dst + want.length))).toEqual(want);
  });

  test("first_bad in the shifted coding finds the first |w| >= 128, inf or NaN", () => {
    const { ex, u8 } = bareKernel(1 << 16);
    const u16 = new Uint16Array(u8.buffer, 1024, 64);
    for (const [bad, at] of [
      [0x5800, 21], // 128
      [0xd800, 3], // -128
      [0x7bff, 40], // 65504, the largest finite
      [0x7c00, 63], // inf, in the scalar tail of a count of 64
      [0xfe00, 0], // NaN
    ] as const) {
      u16.fill(0x57ff); // 127.9375: held
      u16[5] = 0xd7ff;
      expect(ex.first_bad(1024, F16_SHIFTED, 64)).toBe(-1);
      u16[at] = bad;
      expect([bad, ex.first_bad(1024, F16_SHIFTED, 64)]).toEqual([bad, at]);
      // The plain coding refuses only inf and NaN.
      expect(ex.first_bad(1024, KERNEL_INDEX.f16, 64)).toBe((bad & 0x7c00) === 0x7c00 ? at : -1);
    }
  });

  test("an f16 weight of 128 or more past the first stage places the whole matrix in the plain coding", () => {
    // Rows 32 .. 63, the second stage: the first is already placed shifted when row 37 turns up.
    const n = wideCols("f16");
    const rows = 70;
    const stage = 32 * 2 * n;
    for (const big of [0x5800, 0xdc00, 0x7bff]) {
      const m = randomRows("f16", rows, n, 11);
      new DataView(m.bytes.buffer).setUint16((37 * n + 5) * 2, big, true);
      for (const threads of [1, 2]) {
        const k = new MatmulKernel([{ matrix: m, cols: n }], { threads, placeStageBytes: stage });
        kernels.push(k);
        expect(placedShifted(k, k.views[0]!, m, rows, n)).toBe(false);
        const x = new Float32Array(n).map((_, i) => Math.sin(i));
        const y = new Float32Array(rows);
        const want = new Float32Array(rows);
        k.matmul(y, x, k.views[0]!, 0, 1, n, rows);
        matmulRef(want, x, m, 0, 1, n, rows);
        expect(Array.from(new Uint32Array(y.buffer))).toEqual(Array.from(new Uint32Array(want.buffer)));
      }
      // Without it, the same rows are placed shifted.
      const held = randomRows("f16", rows, n, 11);
      const k = new MatmulKernel([{ matrix: held, cols: n }], { threads: 1, placeStageBytes: stage });
      kernels.push(k);
      expect(placedShifted(k, k.views[0]!, held, rows, n)).toBe(true);
    }
  });

  test("PLACE jobs run on the helper threads too, and give the same bytes", async () => {
    // The helpers of a MatmulKernel start while it places (whether they join a small load is a
    // race): here they are up first, so every dispatch is theirs to share.
    const [rows, n] = [203, 2048];
    const m = randomRows("q4_k", rows, n, 3);
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
      // A helper that sleeps between dispatches may miss a few, and on a loaded machine (several
      // busy processes on 2 cores) it was not scheduled within 200 rounds: run the load until one
      // joined, for as long as 20 s.
      const deadline = performance.now() + 20_000;
      do {
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
      } while (threads.helperChunks === 0 && performance.now() < deadline);
      expect(threads.helperChunks).toBeGreaterThan(0);
    } finally {
      threads.close();
    }
  });

  test("touch_pages writes to the pages of its bytes without changing one", () => {
    // Fresh pages cost their first write (the host zeroes them): a helper takes that write ahead
    // of the caller filling them, so it must never change a byte the caller already wrote.
    const bytes = 5 * 65536 + 1000;
    const { ex, u8 } = bareKernel(bytes + 8192);
    const from = 4096 + 3;
    const want = randomBytes(bytes, 11);
    u8.set(want, from);
    ex.touch_pages(from, from + bytes, 0, 2);
    ex.touch_pages(from, from + bytes, 2, 6);
    expect(new Uint8Array(u8.subarray(from, from + bytes))).toEqual(new Uint8Array(want));
  });

  test("TOUCH jobs run on the helper threads too, and change no byte", async () => {
    const ctrl = 4096;
    const jobsAt = ctrl + controlBytes(2) + 64;
    const from = jobsAt + 64;
    const bytes = 64 << 20;
    const { ex, u8, memory } = bareKernel(from + bytes);
    const want = randomBytes(1 << 16, 12);
    for (let o = 0; o < bytes; o += want.length) u8.set(want, from + o);
    const threads = new KernelThreads(kernelModule()!, memory, 2, ctrl);
    try {
      await threads.ready;
      const j = new Int32Array(memory.buffer, jobsAt, JOB_INTS);
      writeTouchJob(j, from, from + bytes);
      expect([j[J_FN], j[J_D]]).toEqual([J_TOUCH, 1024]);
      // Until a helper joined, for as long as 20 s (a loaded machine may not schedule it soon).
      const deadline = performance.now() + 20_000;
      do threads.run(ex, j, 1, 0, 0);
      while (threads.helperChunks === 0 && performance.now() < deadline);
      expect(threads.helperChunks).toBeGreaterThan(0);
      for (let o = 0; o < bytes; o += want.length) expect(new Uint8Array(u8.subarray(from + o, from + o + want.length))).toEqual(new Uint8Array(want));
    } finally {
      threads.close();
    }
  });

  test("a helper touches a 16-bit or q8_0 matrix's strips while the caller places them; K-quants' helpers place", () => {
    const started: { fn: number; from: number; to: number }[] = [];
    const start = KernelThreads.prototype.start;
    KernelThreads.prototype.start = function (this: KernelThreads, ex, jobs, count, scratch, stride) {
      started.push({ fn: jobs[J_FN]!, from: jobs[J_Y]! >>> 0, to: jobs[J_X]! >>> 0 });
      return start.call(this, ex, jobs, count, scratch, stride);
    };
    try {
      for (const dt of ["q8_0", "f16", "q4_k"] as const) {
        started.length = 0;
        const [rows, n] = [83, wideCols(dt)];
        const m = randomRows(dt, rows, n, 6);
        const k = new MatmulKernel([{ matrix: m, cols: n }], { threads: 2 });
        kernels.push(k);
        const at = k.offsetOf(k.views[0]!);
        const touches = started.filter((s) => s.fn === J_TOUCH);
        if (dt === "q4_k") expect(touches).toEqual([]);
        else expect(touches).toEqual([{ fn: J_TOUCH, from: at, to: at + stripBytes(dt, n) * Math.ceil(rows / 8) }]);
      }
    } finally {
      KernelThreads.prototype.start = start;
    }
  });

  test("the progress line is told each stage as it is placed, and every matrix whole", () => {
    const m = randomRows("q4_k", 100, 512, 4);
    const f32 = new Float32Array(64 * 64);
    const told: number[] = [];
    const rowBytes = m.bytes.length / 100;
    const k = new MatmulKernel(
      [
        { matrix: m, cols: 512 },
        { matrix: f32, cols: 64 },
      ],
      { threads: 2, placeStageBytes: 32 * rowBytes, placing: { add: (b) => told.push(b) } },
    );
    kernels.push(k);
    // 100 rows 32 at a time: 32, 32, 32, 4 rows (then 0 left of the matrix); the f32 matrix, packed in JS, whole.
    expect(told).toEqual([32 * rowBytes, 32 * rowBytes, 32 * rowBytes, 4 * rowBytes, 0, f32.byteLength]);
  });

  test("the kernels place every dtype but f32", () => {
    const { ex } = bareKernel(0);
    for (const dt of TYPES) expect(ex.places(KERNEL_INDEX[dt])).toBe(1);
    expect(ex.places(KERNEL_INDEX.f32)).toBe(0);
  });
});
