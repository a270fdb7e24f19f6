import { describe, expect, test } from "bun:test";
import { Transformer } from "../../src/model/index.ts";
import { syntheticWeights, castWeights, MATRICES } from "../../src/model/compute/weights.ts";
import type { Matrix } from "../../src/model/compute/packed.ts";
import { Seq, TINY, bits, newPool, step, tokens } from "./helpers.ts";

/**
 * Builds a Transformer from weights made in here and returns it with weak references to every
 * original matrix: once this returns, only the Transformer could keep them alive.
 */
function build(dtype: "f32" | "f16" | "q8_0", shared: boolean): { m: Transformer; refs: WeakRef<object>[]; want: Float32Array } {
  const w = castWeights(TINY, syntheticWeights(TINY, 21, { sharedClassifier: shared }), dtype);
  const refs = MATRICES.map((k) => new WeakRef(matrixStorage(w[k])));
  const prompt = tokens(9, 4);
  // The logits of a Transformer that still holds the originals: after they go, nothing changes.
  const want = step(new Transformer(TINY, w), new Seq(newPool()), prompt);
  return { m: new Transformer(TINY, w), refs, want };
}

/** The object that holds a matrix's memory. */
function matrixStorage(m: Matrix): object {
  return m instanceof Float32Array ? m.buffer : m.dtype === "stacked" ? m.parts : m.bytes.buffer;
}

async function collect(): Promise<void> {
  // WeakRefs made in a job stay alive until it ends; then a full collection may clear them.
  for (let i = 0; i < 4; i++) {
    await Bun.sleep(0);
    Bun.gc(true);
  }
}

describe("weight ownership", () => {
  test("transformer keeps no original matrix alive", async () => {
    for (const dtype of ["f32", "f16", "q8_0"] as const) {
      for (const shared of [false, true]) {
        // The collector scans the stack conservatively, so a stray word can keep an object for
        // one round: a Transformer that holds its originals keeps them in every attempt.
        let alive: string[] = [];
        for (let attempt = 0; attempt < 5; attempt++) {
          const { m, refs, want } = build(dtype, shared);
          await collect();
          alive = MATRICES.filter((_, i) => refs[i]!.deref() !== undefined);
          // It still runs, from its own copies, the embedding included.
          expect(bits(step(m, new Seq(newPool()), tokens(9, 4)))).toEqual(bits(want));
          if (alive.length === 0) break;
        }
        expect(`${dtype}${shared ? " shared" : ""} keeps: ${alive.join(", ")}`).toBe(`${dtype}${shared ? " shared" : ""} keeps: `);
      }
    }
  });
});
