import { describe, expect, test } from "bun:test";
import { kvShapeOf, Transformer, type ModelConfig } from "../../src/model/index.ts";
import { syntheticWeights, castWeights, type MATRICES, matrixCols, type Weights } from "../../src/model/compute/weights.ts";
import { groupBudget, layerSlice, planEvenGroups, planGroups, roomBytes } from "../../src/model/compute/layer-group.ts";
import { castMatrix, type DType, type Matrix, type PackedMatrix } from "../../src/model/compute/packed.ts";
import { stripLayoutBytes } from "../../src/model/compute/strip-layout.ts";
import { KvPool } from "../../src/pool/index.ts";
import type { MatmulKernel } from "../../src/model/compute/matmul.ts";
import { bits, Seq, tokens } from "./helpers.ts";

/** Polls `get` every millisecond until it gives `want` or `ms` pass; returns its last answer. */
async function settle(get: () => number[], want: number[], ms = 2000): Promise<number[]> {
  const end = performance.now() + ms;
  let v = get();
  while (v.some((n, i) => n !== want[i]) && performance.now() < end) {
    await Bun.sleep(1);
    v = get();
  }
  return v;
}

// A model past one wasm32 memory is cut into layer groups, each its own kernel memory and threads
// (src/model/compute/layer-group.ts). Here groups are forced on a small model by lowering the bytes a
// group may place, and every logit must keep the bits of the one-memory model: the kernels give
// the same bits wherever their operands live, and only the residual stream crosses.

const CFG: ModelConfig = {
  name: "groups",
  dim: 64,
  hiddenDim: 96,
  nLayers: 5,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 80,
  maxSeqLen: 64,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const BLOCK = 4;

/** Placed bytes of one layer of CFG in f32 (strips of 8 rows, whole). */
const LAYER_F32 = 4 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64);

/** Placed bytes of one layer's matrices, and of the embedding, in `dtype`. */
function placedBytes(dtype: DType): { layer: number; embedding: number } {
  const of = (k: (typeof MATRICES)[number], rows: number) => Math.ceil(stripLayoutBytes(dtype, rows, matrixCols(CFG, k)) / 16) * 16;
  const rows = { wq: 64, wk: 32, wv: 32, wo: 64, w1: 96, w2: 64, w3: 96 } as const;
  let layer = 0;
  for (const [k, r] of Object.entries(rows)) layer += of(k as keyof typeof rows, r);
  return { layer, embedding: of("tokenEmbedding", CFG.vocabSize) };
}

function weightsOf(dtype: DType, tied: boolean): Weights<Matrix> {
  const w = syntheticWeights(CFG, 5);
  if (tied) w.wcls = w.tokenEmbedding;
  return castWeights(CFG, w, dtype);
}

/**
 * Logits of a 3-sequence prefill, five batched decode steps and two bigger batches, over a pool in
 * the kernel memories (split by layer when there are several) or one outside them.
 */
function run(
  w: Weights<Matrix>,
  groupBytes: number | undefined,
  threads: number,
  where: "kernel" | "outside" = "kernel",
): { outs: Float32Array[]; memories: number; segments: number } {
  const m = new Transformer(CFG, w, { threads, groupBytes });
  const pool = where === "kernel" ? m.kvPool(kvShapeOf(CFG, BLOCK), 48) : new KvPool(kvShapeOf(CFG, BLOCK), 48);
  const V = CFG.vocabSize;
  const seqs = [new Seq(pool), new Seq(pool), new Seq(pool)];
  const outs: Float32Array[] = [];
  let out = new Float32Array(3 * V);
  m.forward(pool, [seqs[0]!.chunk(tokens(17, 1, V)), seqs[1]!.chunk(tokens(3, 2, V)), seqs[2]!.chunk(tokens(9, 3, V))], out);
  outs.push(out);
  for (let i = 0; i < 5; i++) {
    out = new Float32Array(3 * V);
    m.forward(
      pool,
      seqs.map((s, j) => s.chunk([(i * 11 + j * 7) % V])),
      out,
    );
    outs.push(out);
  }
  // Batches past every one before: the scratch grows after the forwards' K/V copies were allocated.
  for (const n of [12, 25]) {
    out = new Float32Array(3 * V);
    m.forward(
      pool,
      seqs.map((s, j) => s.chunk(tokens(n, 10 + n + j, V))),
      out,
    );
    outs.push(out);
  }
  m.close();
  return { outs, memories: m.memories, segments: pool.segments.length };
}

describe("layer groups", () => {
  test("planGroups takes items in order while they fit; the embedding goes with the classifier when tied", () => {
    const w = weightsOf("f32", false);
    const emb = 4 * 80 * 64;
    // Everything fits: one group.
    expect(planGroups(CFG, w, 10 * LAYER_F32 + 2 * emb)).toEqual([{ first: 0, end: 5, embedding: true, classifier: true }]);
    // Two layers a group: the embedding opens the first group, the classifier closes the last.
    expect(planGroups(CFG, w, 2 * LAYER_F32 + emb)).toEqual([
      { first: 0, end: 2, embedding: true, classifier: false },
      { first: 2, end: 4, embedding: false, classifier: false },
      { first: 4, end: 5, embedding: false, classifier: true },
    ]);
    const tied = weightsOf("f32", true);
    expect(planGroups(CFG, tied, 2 * LAYER_F32)).toEqual([
      { first: 0, end: 2, embedding: false, classifier: false },
      { first: 2, end: 4, embedding: false, classifier: false },
      { first: 4, end: 5, embedding: true, classifier: true },
    ]);
    expect(() => planGroups(CFG, w, LAYER_F32 - 16)).toThrow(/the model's (embedding|layer) takes \d+ bytes placed, past one kernel memory's/);
  });

  test("planEvenGroups evens the groups out at their number, and counts each layer's KV share when it fits", () => {
    const w = weightsOf("f32", false);
    const emb = 4 * 80 * 64;
    const budget = 4 * LAYER_F32 + emb;
    const plan = (ends: [number, number][]) => ends.map(([first, end], i) => ({ first, end, embedding: i === 0, classifier: i === ends.length - 1 }));
    // Greedy leaves the last memory one layer; even, the same two memories take three and two.
    expect(planGroups(CFG, w, budget)).toEqual(
      plan([
        [0, 4],
        [4, 5],
      ]),
    );
    expect(planEvenGroups(CFG, w, budget)).toEqual(
      plan([
        [0, 3],
        [3, 5],
      ]),
    );
    // A layer's share of the pool as big as its weights: two layers a memory.
    expect(planEvenGroups(CFG, w, budget, LAYER_F32)).toEqual(
      plan([
        [0, 2],
        [2, 4],
        [4, 5],
      ]),
    );
    // A share no memory could hold beside its layer is not kept: that pool goes outside.
    expect(planEvenGroups(CFG, w, budget, 4 * LAYER_F32)).toEqual(planEvenGroups(CFG, w, budget));
    // Everything in one memory stays one.
    expect(planEvenGroups(CFG, w, 10 * LAYER_F32)).toEqual([{ first: 0, end: 5, embedding: true, classifier: true }]);
  });

  test("a Transformer told of the engine's pool keeps its share beside each layer: more memories, the pool in place, the same bits", () => {
    const w = weightsOf("f32", false);
    const budget = 4 * LAYER_F32 + 4 * 80 * 64;
    const shape = kvShapeOf(CFG, BLOCK);
    const numBlocks = LAYER_F32 / new KvPool({ ...shape, nLayers: 1 }, 1).blockBytes;
    const apart = new Transformer(CFG, w, { groupBytes: budget });
    const kept = new Transformer(CFG, w, { groupBytes: budget, kvPool: { blockTokens: BLOCK, numBlocks } });
    expect([apart.memories, kept.memories]).toEqual([2, 3]);
    const pool = kept.kvPool(shape, numBlocks);
    expect(pool.segments.map((g) => [g.firstLayer, g.nLayers])).toEqual([
      [0, 2],
      [2, 2],
      [4, 1],
    ]);
    const out = [new Float32Array(CFG.vocabSize), new Float32Array(CFG.vocabSize)];
    const pools = [apart.kvPool(shape, numBlocks), pool];
    [apart, kept].forEach((m, i) => m.forward(pools[i]!, [new Seq(pools[i]!).chunk(tokens(19, 4, CFG.vocabSize))], out[i]!));
    expect(bits(out[1]!)).toEqual(bits(out[0]!));
    apart.close();
    kept.close();
  });

  test("layerSlice views layers l0..l1 of a stacked matrix, packed or not, without a copy", () => {
    const f = new Float32Array(5 * 4 * 32).map((_, i) => i);
    const s = layerSlice(f, 32, 5, 1, 3) as Float32Array;
    expect(s.length).toBe(2 * 4 * 32);
    expect(s[0]).toBe(4 * 32);
    expect(s.buffer).toBe(f.buffer);
    const q = castMatrix(f, "q8_0", 32);
    const qs = layerSlice(q, 32, 5, 2, 5) as PackedMatrix;
    expect(qs.length).toBe(3 * 4 * 32);
    expect(qs.bytes.byteLength).toBe(3 * 4 * 34);
    expect(qs.bytes.byteOffset).toBe(2 * 4 * 34);
  });

  for (const dtype of ["f32", "f16", "q8_0"] as const) {
    for (const tied of [false, true]) {
      test(`${dtype}${tied ? ", tied classifier" : ""}: several memories give the bits of one, on 1 and 2 threads`, () => {
        const w = weightsOf(dtype, tied);
        const { outs: one, memories } = run(w, undefined, 1);
        expect(memories).toBe(1);
        const { layer, embedding } = placedBytes(dtype);
        expect(placedBytes("f32").layer).toBe(LAYER_F32);
        for (const [budget, threads, where] of [
          [layer + embedding, 1, "kernel"],
          [2 * layer + embedding, 2, "kernel"],
          [2 * layer + embedding, 2, "outside"],
        ] as const) {
          const { outs: many, memories, segments } = run(w, budget, threads, where);
          expect(memories).toBeGreaterThanOrEqual(3);
          // In the kernel memories, each memory holding layers holds their share of the pool.
          if (where === "kernel") expect(segments).toBeGreaterThanOrEqual(memories - 1);
          else expect(segments).toBe(1);
          for (let i = 0; i < one.length; i++) expect(bits(many[i]!)).toEqual(bits(one[i]!));
        }
      });
    }
  }

  test("a group's helper threads rest as soon as the forward leaves it, and wake for its next dispatch", async () => {
    // Helpers that would spin a minute: only rest() puts one to sleep within the wait below. Tied,
    // so the last group holds layer 4 with the classifier, and prompts of 16 tokens, so every
    // group's matmuls are shared with its helper (MatmulKernel's SPLIT_MACS).
    const m = new Transformer(CFG, weightsOf("f32", true), { threads: 2, groupBytes: 2 * LAYER_F32, helperSpinMs: 60_000 });
    await m.ready();
    const groups = (m as unknown as { groups: { mm: MatmulKernel }[] }).groups;
    expect(groups.length).toBe(3);
    const asleep = () => groups.map((g) => g.mm.sleepingHelpers);
    const pool = m.kvPool(kvShapeOf(CFG, BLOCK), 16);
    const seq = new Seq(pool);
    const out = new Float32Array(CFG.vocabSize);
    // Every group the forward left rests; the last, where it ended, spins on, though the start
    // of this forward had rested it: its dispatch woke it and cleared the rest.
    const want = [1, 1, 0];
    for (let i = 0; i < 3; i++) {
      m.forward(pool, [seq.chunk(tokens(16, i + 1, CFG.vocabSize))], out);
      expect(await settle(asleep, want)).toEqual(want);
      await Bun.sleep(20);
      expect(asleep()).toEqual(want);
    }
    m.close();
  });

  test("a model in several memories splits its KV pool by layer into them, and says how many it uses", () => {
    const m = new Transformer(CFG, weightsOf("f32", false), { groupBytes: 2 * LAYER_F32 });
    const pool = m.kvPool(kvShapeOf(CFG, BLOCK), 8);
    const groups = (m as unknown as { groups: { first: number; end: number; mm: MatmulKernel }[] }).groups;
    // The embedding with layer 0, then two layers a memory, then the classifier alone.
    expect(groups.map((g) => [g.first, g.end])).toEqual([
      [0, 1],
      [1, 3],
      [3, 5],
      [5, 5],
    ]);
    expect(m.memories).toBe(4);
    expect(pool.segments.map((g) => [g.firstLayer, g.nLayers])).toEqual([
      [0, 1],
      [1, 2],
      [3, 2],
    ]);
    // Each segment in the memory of its layers' group, and in no other.
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 4; j++) expect(groups[j]!.mm.addressOf(pool.segments[i]!.bytes) >= 0).toBe(j === i);
    }
    expect(() => m.kvSlab(1024)).toThrow(/not a whole share for each of 5 layers/);
    m.close();
  });
});

describe("the room a kernel memory keeps beside its weights", () => {
  const LLAMA8B: ModelConfig = {
    name: "8b",
    dim: 4096,
    hiddenDim: 14336,
    nLayers: 32,
    nHeads: 32,
    nKvHeads: 8,
    vocabSize: 128256,
    maxSeqLen: 131072,
    ropeTheta: 5e5,
    normEps: 1e-5,
  };

  test("grows with the context and the threads, and bounds what a group may place", () => {
    // RoPE tables 134 MB and 134 MB of attention scratch a thread at a 128K context: what made a
    // 3.75 GiB group of an 8B Q4_K_M fail its first forward.
    expect(roomBytes(LLAMA8B, 2)).toBeGreaterThan(900 * 2 ** 20);
    expect(roomBytes(LLAMA8B, 2)).toBeGreaterThan(roomBytes({ ...LLAMA8B, maxSeqLen: 4096 }, 2));
    expect(roomBytes(LLAMA8B, 2)).toBeGreaterThan(roomBytes(LLAMA8B, 1));
    expect(groupBudget(LLAMA8B, 2)).toBe(2 ** 32 - roomBytes(LLAMA8B, 2));
    // A short context leaves most of the memory to the weights (the K/V copies' 256 MiB aside).
    expect(groupBudget(CFG, 1)).toBe(2 ** 32 - roomBytes(CFG, 1));
    expect(groupBudget(CFG, 1)).toBeGreaterThan(3.7 * 2 ** 30);
  });

  test("a pool's share is weighed against what a memory placed, not what its forwards took since", () => {
    // RoPE tables of 8 MiB (a 64K context): they are inside the room, so they must not count twice.
    const cfg = { ...CFG, maxSeqLen: 65536 };
    const w = castWeights(cfg, syntheticWeights(cfg, 5), "f16");
    const share = 5 * 2 ** 20;
    const probe = new Transformer(cfg, w, {});
    const low = (probe as unknown as { groups: { placedBytes: number; mm: MatmulKernel }[] }).groups[0]!;
    const beside = low.mm.usedBytes - low.placedBytes;
    probe.close();
    expect(beside).toBeGreaterThanOrEqual(8 * 2 ** 20);
    // Weights placed high, leaving the share and the room with 2 MiB to spare.
    const m = new Transformer(cfg, w, { gapBytes: 2 ** 32 - roomBytes(cfg, 1) - low.placedBytes - share - 2 * 2 ** 20 });
    const g = (m as unknown as { groups: { placedBytes: number; mm: MatmulKernel }[] }).groups[0]!;
    expect(g.placedBytes + share + roomBytes(cfg, 1)).toBeLessThanOrEqual(2 ** 32);
    expect(g.mm.usedBytes + share + roomBytes(cfg, 1)).toBeGreaterThan(2 ** 32);
    const rooms = m.kvSlab(share);
    expect(rooms?.length).toBe(1);
    // What it gave counts from then on: the same again does not fit.
    expect(m.kvSlab(share)).toBeNull();
    m.close();
  });

  test("a KV slab that would leave no room goes outside the kernel memory", () => {
    const w = weightsOf("f16", false);
    const low = new Transformer(CFG, w, {});
    expect(low.kvSlab(5 * 2 ** 24)).not.toBeNull();
    low.close();
    // Weights placed high (a big model stands in): the slab would eat the room forwards grow into.
    const high = new Transformer(CFG, w, { gapBytes: 3.7 * 2 ** 30 });
    expect(high.kernels).toBe("wasm-simd");
    expect(high.kvSlab(5 * 2 ** 24)).toBeNull();
    const pool = high.kvPool(kvShapeOf(CFG, BLOCK), 8);
    const out = new Float32Array(CFG.vocabSize);
    high.forward(pool, [new Seq(pool).chunk(tokens(5, 1, CFG.vocabSize))], out);
    expect(out.every(Number.isFinite)).toBe(true);
    high.close();
  });
});
