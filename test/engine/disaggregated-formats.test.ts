import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { writeFileSync } from "node:fs";
import { servedModelOf, startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER } from "../../src/http/index.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";
import type { ModelConfig } from "../../src/model/index.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { placedBytes } from "../../src/model/compute/layer-group.ts";
import { tempDir } from "../model/format-helpers.ts";
import { encodeGgufModel, writeHfFolder } from "../support/model-writers.ts";
import { sseEvents } from "../support/nodes.ts";

// Disaggregated = colocated on real loaders' output: an HF folder (Llama, split-half q/k) and a
// qwen2-arch Q8_0 GGUF (biases, tied embeddings, head_dim != dim/heads), a Q4_K_M-like GGUF
// (q4_k and q6_k matrices, layers of both in one stack), each held as stored. A byte tokenizer stands
// in for theirs (vocab 258): requests are token ids, so only the weights path is under test.
const tmp = tempDir("disagg-fmt");
const LLAMA: ModelConfig = {
  name: "l",
  dim: 32,
  hiddenDim: 64,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 258,
  maxSeqLen: 64,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const QWEN: ModelConfig = { ...LLAMA, name: "q", headDim: 16, ropeTheta: 1e6, normEps: 1e-6 };
const B = 4;

/** K-quant rows are whole super-blocks of 256. */
const WIDE: ModelConfig = { ...LLAMA, name: "k", dim: 256, hiddenDim: 512, nLayers: 3 };

/** llama.cpp's Q4_K_M recipe in miniature: q6_k for the classifier and some layers' attn_v and ffn_down, q4_k elsewhere. */
function q4km(name: string): "q4_k" | "q6_k" {
  if (name === "output.weight") return "q6_k";
  const m = /^blk\.(\d+)\.(attn_v|ffn_down)\.weight$/.exec(name);
  return m !== null && Number(m[1]) !== 1 ? "q6_k" : "q4_k";
}

function served(path: string, groupBytes?: number) {
  // As stored: a Q4_K_M file's matrices stay q4_k and q6_k (the others' packed dtypes too).
  const m = readModelFiles(path, { dtype: "as-stored" });
  return servedModelOf({ ...m, tokenizer: new ByteTokenizer(), eosIds: [257], chatTemplate: null }, { groupBytes, threads: 1 });
}

/**
 * For these, P and D hold the model in several kernel memories (layer-group.ts), the colocated
 * engine in one: a budget of the largest of one layer's, the embedding's and the classifier's
 * placed bytes puts about one item in each.
 */
const GROUPED = new Set(["qwen2 q8_0 gguf, P and D in three kernel memories", "q4_k_m gguf, P and D in several kernel memories"]);
function oneItemEach(path: string): number {
  const m = readModelFiles(path, { dtype: "as-stored" });
  const b = placedBytes(m.cfg, m.weights);
  return Math.max(b.layer, b.classifier, b.embedding);
}

const models: Record<string, () => string> = {
  "hf folder": () => {
    writeHfFolder(tmp.path("hf"), LLAMA, syntheticWeights(LLAMA, 11));
    return tmp.path("hf");
  },
  "qwen2 q8_0 gguf": () => {
    writeFileSync(
      tmp.path("q.gguf"),
      encodeGgufModel(QWEN, syntheticWeights(QWEN, 12, { sharedClassifier: true, biases: true }), { arch: "qwen2", tied: true, type: "q8_0" }),
    );
    return tmp.path("q.gguf");
  },
  "q4_k_m gguf (q4_k and q6_k layers)": () => {
    writeFileSync(tmp.path("k.gguf"), encodeGgufModel(WIDE, syntheticWeights(WIDE, 13), { typeOf: q4km }));
    return tmp.path("k.gguf");
  },
  "qwen2 q8_0 gguf, P and D in three kernel memories": () => models["qwen2 q8_0 gguf"]!(),
  "q4_k_m gguf, P and D in several kernel memories": () => models["q4_k_m gguf (q4_k and q6_k layers)"]!(),
};

afterAll(tmp.cleanup);

for (const [label, make] of Object.entries(models)) {
  describe(`disaggregated_equals_colocated on a ${label}`, () => {
    let P: EngineNode, D: EngineNode, C: EngineNode;
    beforeAll(async () => {
      const path = make();
      const common = { blockTokens: B, numBlocks: 64 };
      const groups = GROUPED.has(label) ? oneItemEach(path) : undefined;
      [P, D, C] = await Promise.all([
        startEngineNode({ role: "prefill", model: served(path, groups), ...common }),
        startEngineNode({ role: "decode", model: served(path, groups), ...common }),
        startEngineNode({ role: "both", model: served(path), ...common }),
      ]);
      expect(C.model.memories).toBe(1);
      if (GROUPED.has(label)) {
        expect(P.model.memories).toBeGreaterThanOrEqual(3);
        expect(D.model.memories).toBe(P.model.memories!);
        // Each memory holds its layers' share of the pool, read in place: blocks travel gathered.
        expect(P.pool.segments.length).toBeGreaterThan(1);
        expect(D.pool.segments.length).toBe(P.pool.segments.length);
      } else expect([P.model.memories, D.model.memories]).toEqual([1, 1]);
    });
    afterAll(async () => {
      await Promise.all([P, D, C].map((n) => n?.shutdown()));
    });

    const prompts = [
      [65, 66, 67],
      [72, 101, 108, 108, 111, 44, 32, 119],
      [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98],
    ];
    for (const prompt of prompts) {
      for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 7 }]) {
        test(`${prompt.length}-token prompt, ${sampling.temperature === 0 ? "greedy" : "seeded"}`, async () => {
          const res = await fetch(`http://${C.httpAddress}/v1/completions`, {
            method: "POST",
            body: JSON.stringify({ prompt, max_tokens: 10, return_token_ids: true, ...sampling }),
          });
          expect(res.status).toBe(200);
          const want = ((await res.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
          const control = grpcClient(EngineControl, P.grpcAddress, { timeoutMs: 10_000 });
          const handle = await control.prefill(
            create(PrefillRequestSchema, {
              requestId: `r-${Math.random()}`,
              promptTokens: prompt,
              sampling: { temperature: sampling.temperature, maxTokens: 10, seed: sampling.seed === undefined ? undefined : BigInt(sampling.seed) },
              decodeTarget: D.kvAddress,
              kvFormat: 1,
            }),
          );
          const r2 = await fetch(`http://${D.httpAddress}/v1/completions`, {
            method: "POST",
            headers: { [HANDLE_HEADER]: handle.handleId, [FIRST_TOKEN_HEADER]: String(handle.firstToken), [DRAWS_HEADER]: String(handle.rngDrawsConsumed) },
            body: JSON.stringify({
              prompt: handle.promptTokens,
              max_tokens: 10,
              temperature: sampling.temperature,
              seed: handle.seed.toString(),
              stream: true,
              return_token_ids: true,
            }),
          });
          expect(r2.status).toBe(200);
          const events = (await sseEvents(r2)) as ({ choices: { token_ids?: number[] }[] } | string)[];
          const rest = events.flatMap((e) => (typeof e === "string" ? [] : e.choices.flatMap((c) => c.token_ids ?? [])));
          expect([handle.firstToken, ...rest]).toEqual(want);
        });
      }
    }
  });
}

describe("engines with different model shapes refuse each other's pushes", () => {
  let P: EngineNode, Pg: EngineNode, D: EngineNode;
  beforeAll(async () => {
    // Same layers and KV heads, head_dim 16 vs 8: only the shape check tells them apart.
    const qwen = models["qwen2 q8_0 gguf"]!();
    [P, Pg, D] = await Promise.all([
      startEngineNode({ role: "prefill", model: served(qwen), blockTokens: B, numBlocks: 64 }),
      startEngineNode({ role: "prefill", model: served(qwen), blockTokens: B, numBlocks: 64, useDataPlane: false }),
      startEngineNode({ role: "decode", model: served(models["hf folder"]!()), blockTokens: B, numBlocks: 64 }),
    ]);
  });
  afterAll(async () => {
    await Promise.all([P, Pg, D].map((n) => n?.shutdown()));
  });

  for (const path of ["data plane", "gRPC"]) {
    test(`over the ${path}: a push of head_dim 16 blocks into a head_dim 8 pool fails its precondition; nothing leaks`, async () => {
      const src = path === "gRPC" ? Pg : P;
      expect(src.pool.shape.headDim).toBe(16);
      expect(D.pool.shape.headDim).toBe(8);
      const control = grpcClient(EngineControl, src.grpcAddress, { timeoutMs: 10_000 });
      const err = await control
        .prefill(
          create(PrefillRequestSchema, {
            requestId: `shape-${path}`,
            promptTokens: [65, 66, 67, 68, 69],
            sampling: { temperature: 0, maxTokens: 4 },
            decodeTarget: D.kvAddress,
            kvFormat: 1,
          }),
        )
        .then(
          () => null,
          (e: unknown) => e as { code: number; message: string },
        );
      expect(err).not.toBeNull();
      console.log(`expected refusal of a push over the ${path}: ${err!.message}`);
      expect(err!.message).toMatch(/failed_precondition/);
      expect(err!.message).toMatch(/D=8|headDim|head_dim|shape/);
      expect(src.pool.used).toBe(0);
      expect(D.pool.used).toBe(0);
    });
  }
});
