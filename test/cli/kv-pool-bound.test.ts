import { expect, test } from "bun:test";
import { kvPoolFor, type ServedModel } from "../../src/cli/engine-node.ts";
import { ConfigError } from "../../src/cli/options.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";

// One ArrayBuffer holds at most 4 GiB in Bun, and the KV pool is one: an 8B-shape model's 2 MiB
// blocks allow 2048 of them. More is refused at start with the number that fits, not an
// "Out of memory" from deep inside.
test("a KV pool past 4 GiB is refused at start, naming the most blocks that fit", async () => {
  const model = {
    name: "m",
    runner: { vocabSize: 258, post: () => {} },
    tokenizer: new ByteTokenizer(),
    nLayers: 32,
    nKvHeads: 8,
    headDim: 128,
    maxSeqLen: 64,
  } as unknown as ServedModel;
  const shape = { blockTokens: 16, nLayers: 32, nKvHeads: 8, headDim: 128 };
  const err = await kvPoolFor(model, shape, 2049).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ConfigError);
  expect((err as Error).message).toBe(
    "--num-blocks 2049: a KV pool of 4.00 GiB (2097152 bytes a block for this model) is past the 4 GiB one buffer holds; at most 2048 blocks",
  );
  const small = await kvPoolFor(model, shape, 4);
  expect(small.total).toBe(4);
});
