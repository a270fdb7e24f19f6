import { describe, expect, test } from "bun:test";
import { layerSlice } from "../../src/model/layer-group.ts";
import { MatmulKernel } from "../../src/model/matmul.ts";
import { castMatrix, type Matrix, matrixByteLength, type PackedMatrix, stackedPacked } from "../../src/model/packed.ts";
import { bits } from "./helpers.ts";

// A matrix stacked from layers keeps its layers as parts (assemble-weights.ts): the loader never
// copies a whole model onto the heap before the kernels copy it into their memory, so a model is
// resident once while loading (peak RSS ~ the file, not twice it).

const COLS = 64;
const ROWS_PER_LAYER = 24;
const LAYERS = 4;

function layersOf(dtype: "f16" | "q8_0"): PackedMatrix[] {
  return Array.from({ length: LAYERS }, (_, l) => {
    const f = new Float32Array(ROWS_PER_LAYER * COLS).map((_, i) => Math.sin(i * 0.37 + l));
    return castMatrix(f, dtype, COLS) as PackedMatrix;
  });
}

/** m with a counter on every read of its `bytes`. */
function spied(m: PackedMatrix): { m: PackedMatrix; reads: () => number } {
  let n = 0;
  const spy = Object.create(m, {
    bytes: {
      get() {
        n++;
        return m.bytes;
      },
    },
  }) as PackedMatrix;
  return { m: spy, reads: () => n };
}

describe("stacked matrices in parts", () => {
  for (const dtype of ["f16", "q8_0"] as const) {
    test(`${dtype}: placing a stacked matrix reads its parts, never its whole bytes, and computes the same bits`, () => {
      const layers = layersOf(dtype);
      const whole: PackedMatrix = { dtype, cols: COLS, length: LAYERS * ROWS_PER_LAYER * COLS, bytes: Buffer.concat(layers.map((l) => l.bytes)) };
      const { m, reads } = spied(
        stackedPacked(
          dtype,
          COLS,
          layers.map((l) => l.bytes),
        ),
      );
      expect(m.length).toBe(whole.length);
      expect(matrixByteLength(m)).toBe(whole.bytes.length);
      const a = new MatmulKernel([{ matrix: m, cols: COLS }], { threads: 2 });
      const b = new MatmulKernel([{ matrix: whole, cols: COLS }]);
      expect(reads()).toBe(0);
      const x = new Float32Array(3 * COLS).map((_, i) => Math.cos(i * 0.11));
      const rows = LAYERS * ROWS_PER_LAYER;
      const ya = new Float32Array(3 * rows);
      const yb = new Float32Array(3 * rows);
      a.matmul(ya, x, a.views[0]!, 0, 3, COLS, rows);
      b.matmul(yb, x, b.views[0]!, 0, 3, COLS, rows);
      expect(bits(ya)).toEqual(bits(yb));
      a.close();
      // Something that does want the whole bytes (the plain-JS fallback) gets them, in order.
      expect(Buffer.from(m.bytes).equals(Buffer.from(whole.bytes))).toBe(true);
    });
  }

  test("a layer slice of a stacked matrix is its parts, and a cast goes part by part", () => {
    const layers = layersOf("f16");
    const m = stackedPacked(
      "f16",
      COLS,
      layers.map((l) => l.bytes),
    );
    const s = layerSlice(m, COLS, LAYERS, 1, 3) as PackedMatrix;
    expect(s.parts).toEqual([layers[1]!.bytes, layers[2]!.bytes]);
    expect(s.length).toBe(2 * ROWS_PER_LAYER * COLS);
    const q = castMatrix(m, "q8_0", COLS) as PackedMatrix;
    expect(q.parts?.length).toBe(LAYERS);
    const wholeQ = castMatrix(
      { dtype: "f16", cols: COLS, length: m.length, bytes: Buffer.concat(layers.map((l) => l.bytes)) } as Matrix,
      "q8_0",
      COLS,
    ) as PackedMatrix;
    expect(Buffer.from(q.bytes).equals(Buffer.from(wholeQ.bytes))).toBe(true);
  });
});
