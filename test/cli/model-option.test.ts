import { afterAll, describe, expect, test } from "bun:test";
import { startEngineNode } from "../../src/cli/engine-node.ts";
import { parseArgs } from "../../src/cli/options.ts";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { LoadProgress } from "../../src/model/compute/load-progress.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { tokenizerFingerprint } from "../../src/tokenizer/index.ts";
import { writeLlama2cCheckpoint } from "../../src/model/load/llama2c.ts";
import { writeLlama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { CKPT, tempDir } from "../model/format-helpers.ts";

const tmp = tempDir("model-opt");
afterAll(tmp.cleanup);

describe("--model / --served-model-name", () => {
  test("served_model_name is a flag and a TOML key of both sections", () => {
    const { config } = parseArgs(["--served-model-name", "mine"]);
    expect(config.engine.served_model_name).toBe("mine");
    expect(parseArgs(["--role", "gateway", "--served-model-name", "gw"]).config.gateway.served_model_name).toBe("gw");
  });

  test("an engine serves a llama2.c model under its served name and lists its size", async () => {
    const vocab = Array.from({ length: CKPT.vocabSize }, (_, i) => ({
      piece: i < 3 ? ["<unk>", "<s>", "</s>"][i]! : `<0x${(i - 3).toString(16).toUpperCase().padStart(2, "0")}>`,
      score: 0,
    }));
    writeLlama2cCheckpoint(tmp.path("m.bin"), CKPT, syntheticWeights(CKPT, 4), false);
    writeLlama2cTokenizer(tmp.path("t.bin"), vocab);
    const node = await startEngineNode({
      role: "both",
      modelPath: tmp.path("m.bin"),
      tokenizerPath: tmp.path("t.bin"),
      servedModelName: "mine",
      blockTokens: 4,
      numBlocks: 32,
    });
    try {
      const models = (await (await fetch(`http://${node.httpAddress}/v1/models`)).json()) as { data: Record<string, unknown>[] };
      const params =
        CKPT.vocabSize * CKPT.dim * 2 +
        CKPT.nLayers * (2 * CKPT.dim + 2 * CKPT.dim * CKPT.dim + 2 * (CKPT.dim / 2) * CKPT.dim + 3 * CKPT.dim * CKPT.hiddenDim) +
        CKPT.dim;
      expect(models.data[0]).toMatchObject({ id: "mine", parameters: params, dtype: "f32", resident_bytes: params * 4 });
      const wrong = await fetch(`http://${node.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt: [1, 5], max_tokens: 2 }),
      });
      expect(wrong.status).toBe(404);
      const info = await grpcClient(EngineControl, node.grpcAddress, { timeoutMs: 5000 }).info({});
      expect({ model: info.model, vocab: info.vocabSize, fp: info.tokenizerFingerprint }).toEqual({
        model: "mine",
        vocab: CKPT.vocabSize,
        fp: tokenizerFingerprint(node.model.tokenizer),
      });
      const ok = await fetch(`http://${node.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "mine", prompt: [1, 5], max_tokens: 2, return_token_ids: true }),
      });
      expect(ok.status).toBe(200);
    } finally {
      await node.shutdown();
    }
  });

  test("the default name is the file name; a missing tokenizer is refused before anything starts", async () => {
    const node = await startEngineNode({ role: "both", modelPath: tmp.path("m.bin"), tokenizerPath: tmp.path("t.bin"), blockTokens: 4, numBlocks: 32 });
    expect(node.model.name).toBe("m");
    await node.shutdown();
    await expect(startEngineNode({ role: "both", modelPath: tmp.path("m.bin"), blockTokens: 4, numBlocks: 32 })).rejects.toThrow(
      /is a llama2\.c checkpoint: it needs --tokenizer/,
    );
  });
});

describe("load progress", () => {
  test("silent for a fast load; one line a second, then a final line, for a slow one", () => {
    let t = 0;
    const lines: string[] = [];
    const fast = new LoadProgress(
      "m",
      100,
      (l) => lines.push(l),
      () => t,
    );
    fast.add(100);
    fast.finish();
    expect(lines).toEqual([]);
    const slow = new LoadProgress(
      "big",
      4 * 1048576,
      (l) => lines.push(l),
      () => t,
    );
    for (let i = 0; i < 4; i++) {
      t += 600;
      slow.add(1048576);
    }
    slow.finish();
    expect(lines).toEqual(["loading big: 2/4 MiB", "loading big: 4/4 MiB", "loaded big: 4 MiB in 2.4 s"]);
  });
});
