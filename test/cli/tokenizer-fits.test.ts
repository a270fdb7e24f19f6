import { afterAll, describe, expect, test } from "bun:test";
import { loadModel } from "../../src/cli/engine-node.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { CKPT, tempDir } from "../model/format-helpers.ts";
import { writeHfFolder } from "../support/model-writers.ts";

const tmp = tempDir("tok-fits");
afterAll(tmp.cleanup);

describe("tokenizer must fit the model", () => {
  // The tiny tokenizer.json writeHfFolder writes has 4 tokens: a model of 3 cannot embed them all.
  const cfg = { ...CKPT, vocabSize: 3 };
  const dir = tmp.path("small-vocab");
  writeHfFolder(dir, cfg, syntheticWeights(cfg, 5));

  for (const modelThread of ["worker", "main"] as const) {
    test(`refused at load, model thread ${modelThread}`, async () => {
      await expect(loadModel({ modelPath: dir, modelThread })).rejects.toThrow(/the tokenizer has 4 tokens, more than the model's vocab_size 3/);
    });
  }
});
