import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { kvShapeOf, Transformer } from "../../src/model/index.ts";
import { parseGguf } from "../../src/model/load/gguf.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights, type Weights } from "../../src/model/compute/weights.ts";
import { layerSlice } from "../../src/model/compute/layer-group.ts";
import { mapFile } from "../../src/model/compute/mapped-file.ts";
import { castMatrix, isStacked, type PackedMatrix, type StackedMatrix, type Matrix } from "../../src/model/compute/packed.ts";
import { KvPool } from "../../src/pool/index.ts";
import { encodeGgufModel } from "../support/model-writers.ts";
import { CKPT, tempDir } from "./format-helpers.ts";
import { bits, Seq, tokens } from "./helpers.ts";

// A matrix stacked from layers keeps each packed layer as a part of its own (assemble-weights.ts),
// a view of the file: the loader never copies a whole model onto the heap before the kernels
// copy it into their memory, so a model is resident once while loading (peak RSS ~ the file).

const tmp = tempDir("stacked-parts");
afterAll(() => tmp.cleanup());
const CFG = { ...CKPT, nLayers: 4 };

function readF16(): { path: string; w: Weights<Matrix> } {
  const path = tmp.path("m.gguf");
  writeFileSync(path, encodeGgufModel(CFG, syntheticWeights(CFG, 21), { type: "f16" }));
  return { path, w: readModelFiles(path, { dtype: "as-stored" }).weights };
}

describe("stacked matrices in parts", () => {
  test("each packed layer is its own part, a view of the file where its tensor is", () => {
    const { path, w } = readF16();
    const g = parseGguf(mapFile(path), path);
    const q = w.wq as StackedMatrix;
    expect(isStacked(q)).toBe(true);
    expect(q.parts.length).toBe(CFG.nLayers);
    q.parts.forEach((p, l) => {
      const t = g.tensors.find((t) => t.name === `blk.${l}.attn_q.weight`)!;
      // The file's one mapping: a part's byteOffset in it is its tensor's place in the file.
      expect((p as PackedMatrix).bytes.buffer).toBe((q.parts[0] as PackedMatrix).bytes.buffer);
      expect((p as PackedMatrix).bytes.byteOffset).toBe(g.dataOffset + t.offset);
    });
  });

  test("a model of stacked parts gives the bits of the same weights concatenated", () => {
    const { w } = readF16();
    const whole: Weights<Matrix> = { ...w };
    for (const k of ["wq", "wk", "wv", "wo", "w1", "w2", "w3"] as const) {
      const s = w[k] as StackedMatrix;
      whole[k] = { dtype: "f16", cols: s.cols, length: s.length, bytes: Buffer.concat(s.parts.map((p) => (p as PackedMatrix).bytes)) };
    }
    const logits = (weights: Weights<Matrix>): number[] => {
      const m = new Transformer(CFG, weights, { threads: 2 });
      const pool = new KvPool(kvShapeOf(CFG, 4), 16);
      const out = new Float32Array(CFG.vocabSize);
      m.forward(pool, [new Seq(pool).chunk(tokens(11, 3, CFG.vocabSize))], out);
      m.close();
      return bits(out);
    };
    expect(logits(w)).toEqual(logits(whole));
  });

  test("a cast goes part by part and stays stacked; a layer slice is the layers' parts", () => {
    const { w } = readF16();
    const s = w.w1 as StackedMatrix;
    const q = castMatrix(s, "q8_0", CFG.dim) as StackedMatrix;
    expect(isStacked(q)).toBe(true);
    expect(q.parts.length).toBe(s.parts.length);
    const whole: PackedMatrix = { dtype: "f16", cols: CFG.dim, length: s.length, bytes: Buffer.concat(s.parts.map((p) => (p as PackedMatrix).bytes)) };
    const wq = castMatrix(whole, "q8_0", CFG.dim) as PackedMatrix;
    expect(Buffer.concat(q.parts.map((p) => (p as PackedMatrix).bytes)).equals(Buffer.from(wq.bytes))).toBe(true);
    const slice = layerSlice(s, CFG.dim, CFG.nLayers, 1, 3) as StackedMatrix;
    expect(slice.parts).toEqual([s.parts[1]!, s.parts[2]!]);
    // One layer is a view of its part: the same bytes of the same buffer, nothing copied.
    const one = (layerSlice(s, CFG.dim, CFG.nLayers, 2, 3) as PackedMatrix).bytes;
    const part = (s.parts[2] as PackedMatrix).bytes;
    expect([one.buffer === part.buffer, one.byteOffset, one.byteLength]).toEqual([true, part.byteOffset, part.byteLength]);
  });
});
