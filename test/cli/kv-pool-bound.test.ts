import { expect, test } from "bun:test";
import { kvPoolFor, type ServedModel, startEngineNode } from "../../src/cli/engine-node.ts";
import { ConfigError } from "../../src/cli/options.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";
import { fakeServedModel } from "../support/nodes.ts";
import { kvShapeOf, loadSyntheticModel, SYNTHETIC_MODEL_NAME } from "../../src/model/index.ts";
import { placedBytes } from "../../src/model/compute/layer-group.ts";
import { blockPayloadBytes } from "../../src/codec/kv-shape.ts";

// One ArrayBuffer holds at most 4 GiB in Bun, and a KV pool outside the model's kernel memories
// is one: an 8B-shape model's 2 MiB blocks allow 2048 of them. More is refused at start with the
// number that fits, not an "Out of memory" from deep inside, unless the kernel memories take
// the pool split by layer (Transformer.kvSlab).
/** An 8B-shape model as far as kvPoolFor looks, with `kvSlab` its kernel memories' answer (none: no kernel memory). */
function eightB(kvSlab?: ServedModel["kvSlab"]): ServedModel {
  const model = {
    name: "m",
    runner: { vocabSize: 258, post: () => {} },
    tokenizer: new ByteTokenizer(),
    nLayers: 32,
    nKvHeads: 8,
    headDim: 128,
    maxSeqLen: 64,
    kvSlab,
  };
  return model as unknown as ServedModel;
}
const shape = { blockTokens: 16, nLayers: 32, nKvHeads: 8, headDim: 128 };

test("a KV pool past 4 GiB is refused at start, naming the most blocks that fit", async () => {
  const model = eightB();
  const err = await kvPoolFor(model, shape, 2049).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ConfigError);
  expect((err as Error).message).toBe(
    "--num-blocks 2049: a KV pool of 4.00 GiB (2097152 bytes a block for this model) is past the 4 GiB one buffer holds, and the model's kernel memories have no room for it; at most 2048 blocks",
  );
  const small = await kvPoolFor(model, shape, 4);
  expect(small.total).toBe(4);
});

test("a KV pool past 4 GiB is built split by layer when the kernel memories give it room", async () => {
  // Two memories of 16 layers each, as kvSlab hands them out (untouched pages: no RSS to speak of).
  const rooms = [0, 16].map((firstLayer) => ({ slab: new SharedArrayBuffer(2049 * 2 ** 20), slabOffset: 0, firstLayer, nLayers: 16 }));
  let asked = 0;
  const model = eightB(async (bytes: number) => {
    asked = bytes;
    return rooms;
  });
  const pool = await kvPoolFor(model, shape, 2049);
  expect(asked).toBe(2049 * 2 ** 21);
  expect(pool.total).toBe(2049);
  expect(pool.segments.map((g) => [g.firstLayer, g.nLayers, g.bytes.buffer])).toEqual(rooms.map((r) => [r.firstLayer, 16, r.slab]));
});

test("an engine tells its model thread of the pool to come: each memory keeps its layers' share, and takes it", async () => {
  const m = loadSyntheticModel();
  const b = placedBytes(m.cfg, m.weights);
  // About one layer a memory; a pool whose share of a layer is as big as the layer: twice as many.
  const groupBytes = 2 * Math.max(b.layer, b.embedding, b.classifier);
  const numBlocks = Math.ceil(b.layer / blockPayloadBytes({ ...kvShapeOf(m.cfg, 8), nLayers: 1 }));
  const memories: number[] = [];
  for (const n of [1, numBlocks]) {
    const node = await startEngineNode({ role: "both", modelPath: SYNTHETIC_MODEL_NAME, groupBytes, blockTokens: 8, numBlocks: n, threads: 1 });
    try {
      memories.push(node.model.memories!);
      expect(node.pool.segments.length).toBeGreaterThan(1);
      expect(node.kvInKernel).toBe(true);
      expect(node.pool.total).toBe(n);
    } finally {
      await node.shutdown();
    }
  }
  expect(memories[1]!).toBeGreaterThan(memories[0]!);
  // A model with no kernel memory to give (here a fake one): the pool is a slab of its own, and the node says so.
  const own = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 8 });
  expect([own.kvInKernel, own.pool.segments.length]).toEqual([false, 1]);
  await own.shutdown();
});
