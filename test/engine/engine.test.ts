import { describe, expect, test } from "bun:test";
import { Engine, type ModelPort, type SamplingParams, transformerPort } from "../../src/engine/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { FakeRunner } from "../support/fake-model.ts";

const shape = { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 };
const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 12, stopTokenIds: [] };
const seeded = (seed: bigint): SamplingParams => ({ ...greedy, temperature: 0.8, topP: 0.95, seed });

function makeEngine(blocks = 64, maxBatchTokens = 32, runner = new FakeRunner()) {
  const pool = new KvPool(shape, blocks);
  return { pool, runner, engine: new Engine({ model: runner, pool, maxBatchTokens, maxModelLen: 256 }) };
}

const prompts = [
  [5, 6, 7], // shorter than a block
  [1, 2, 3, 4, 5, 6, 7, 8], // ends on a block boundary
  [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], // with a tail
];

async function runAlone(prompt: number[], sampling: SamplingParams) {
  const { engine, pool } = makeEngine();
  const f = await engine.submit({ requestId: "r", promptTokens: prompt, sampling });
  expect(pool.used).toBe(0);
  return f.outputTokens;
}

describe("engine", () => {
  test("batching gives the same tokens as one at a time", async () => {
    for (const sampling of [greedy, seeded(7n), seeded(99n)]) {
      const alone = await Promise.all(prompts.map((p) => runAlone(p, sampling)));
      const { engine, pool } = makeEngine(64, 8); // small budget: chunked prefill mixed with decodes
      const streamed: number[][] = prompts.map(() => []);
      const together = await Promise.all(
        prompts.map((p, i) => engine.submit({ requestId: `r${i}`, promptTokens: p, sampling, onToken: (t) => streamed[i]!.push(t) })),
      );
      expect(together.map((f) => f.outputTokens)).toEqual(alone);
      expect(streamed).toEqual(alone);
      expect(together.every((f) => f.reason === "length" && f.outputTokens.length === 12)).toBe(true);
      expect(pool.used).toBe(0);
    }
  });

  test("a prefix hit skips compute and changes nothing", async () => {
    const { engine, pool, runner } = makeEngine();
    const shared = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    const a = await engine.submit({ requestId: "a", promptTokens: [...shared, 40], sampling: greedy });
    const before = runner.tokensComputed;
    const b = await engine.submit({ requestId: "b", promptTokens: [...shared, 40], sampling: greedy });
    expect(b.prefixHitTokens).toBe(12);
    expect(runner.tokensComputed - before).toBe(1 + 11); // the last prompt token, then 11 decodes
    expect(b.outputTokens).toEqual(a.outputTokens);
    expect(engine.stats.prefixHitTokens).toBe(12);
    expect(pool.used).toBe(0);
    // a prompt that is wholly cached still computes its last block's token
    const c = await engine.submit({ requestId: "c", promptTokens: shared, sampling: greedy });
    const c2 = await engine.submit({ requestId: "c2", promptTokens: shared, sampling: greedy });
    expect(c2.prefixHitTokens).toBe(8);
    expect(c2.outputTokens).toEqual(c.outputTokens);
  });

  test("preemption recomputes and leaves the pool at baseline", async () => {
    const sampling = { ...seeded(3n), maxTokens: 20 };
    const alone = await Promise.all(prompts.map((p) => runAlone(p, sampling)));
    const { engine, pool } = makeEngine(12, 64); // 3 sequences of up to 31 tokens need 21 blocks
    const got = await Promise.all(prompts.map((p, i) => engine.submit({ requestId: `p${i}`, promptTokens: p, sampling })));
    expect(engine.stats.preemptions).toBeGreaterThan(0);
    expect(got.map((f) => f.outputTokens)).toEqual(alone);
    expect(pool.used).toBe(0);
    expect(pool.used + pool.cached + pool.free).toBe(pool.total);
  });

  test("cancel at any point frees the request's blocks", async () => {
    for (const after of [0, 1, 3, 7]) {
      const { engine, pool } = makeEngine();
      let n = 0;
      const done = engine.submit({
        requestId: "x",
        promptTokens: prompts[2]!,
        sampling: { ...greedy, maxTokens: 50 },
        onToken: () => {
          if (++n === after) engine.cancel("x");
        },
      });
      if (after === 0) expect(engine.cancel("x")).toBe(true);
      const f = await done;
      expect(f.reason).toBe("cancelled");
      expect(pool.used).toBe(0);
      expect(engine.cancel("x")).toBe(false);
    }
  });

  test("stop tokens and max_tokens end a request", async () => {
    const first = await runAlone(prompts[1]!, greedy);
    const { engine } = makeEngine();
    const f = await engine.submit({ requestId: "s", promptTokens: prompts[1]!, sampling: { ...greedy, stopTokenIds: [first[2]!] } });
    expect(f.reason).toBe("stop");
    expect(f.outputTokens).toEqual(first.slice(0, 3));
    const g = await engine.submit({ requestId: "m", promptTokens: prompts[1]!, sampling: { ...greedy, maxTokens: 1 } });
    expect([g.reason, g.outputTokens.length]).toEqual(["length", 1]);
  });

  test("prefill on one engine and resume on another equals one engine", async () => {
    for (const sampling of [greedy, seeded(5n), seeded(1234n)]) {
      for (const prompt of prompts) {
        const colocated = await runAlone(prompt, sampling);
        const p = makeEngine();
        const d = makeEngine();
        d.pool.allocate(3); // so D's block ids differ from P's
        const pre = await p.engine.submit({ requestId: "q", promptTokens: prompt, sampling, prefillOnly: true });
        const out = pre.prefill!;
        expect(out.finished).toBe(false);
        expect(out.draws).toBe(sampling.temperature > 0 ? 1 : 0);
        const ids = d.pool.import(p.pool.export(out.blockIds))!;
        p.pool.releaseAll(out.blockIds);
        expect(p.pool.used).toBe(0);
        const rest: number[] = [];
        const fin = await d.engine.submit({
          requestId: "q",
          promptTokens: prompt,
          sampling,
          resume: { blockIds: ids, firstToken: out.firstToken, draws: out.draws },
          onToken: (t) => rest.push(t),
        });
        expect([out.firstToken, ...rest]).toEqual(colocated);
        expect(fin.outputTokens).toEqual(colocated);
        expect(d.pool.used).toBe(3);
      }
    }
  });

  test("a forward that throws as it is called fails its requests and frees every block (synchronous and pipelined models)", async () => {
    const inner = new FakeRunner();
    let calls = 0;
    // The third call throws: the synchronous model's second decode, or a step posted ahead of two in flight.
    const boom = () => {
      if (++calls === 3) throw new Error("boom");
    };
    const sync = transformerPort({
      cfg: { vocabSize: inner.vocabSize },
      forward: (pool, batch, out) => {
        boom();
        inner.forward(pool, batch, out);
      },
    });
    const pipelined: ModelPort = {
      vocabSize: inner.vocabSize,
      pipelineDepth: 4,
      post: (b, done) => {
        boom();
        const rows = b.chunks.map((c) => ({ ...c, tokens: Array.from(c.tokens, (t) => (t < 0 ? 1 : t)) }));
        inner.forward(b.pool, rows, b.logits);
        const sampled = Int32Array.from(b.sampling, (r) => (r ? 1 : -1));
        void Bun.sleep(1).then(() => done(sampled, null));
      },
    };
    for (const model of [sync, pipelined]) {
      calls = 0;
      const pool = new KvPool(shape, 64);
      const engine = new Engine({ maxBatchTokens: 512, model, pool, maxModelLen: 256 });
      const f = await engine.submit({ requestId: "a", promptTokens: [1, 2, 3, 4, 5], sampling: greedy });
      expect([f.reason, f.error]).toEqual(["error", "boom"]);
      for (let i = 0; i < 100 && pool.used > 0; i++) await Bun.sleep(1);
      expect(pool.used).toBe(0);
      expect(engine.inFlight).toBe(0);
    }
  });

  test("a prompt larger than the pool fails instead of waiting forever", async () => {
    const { engine, pool } = makeEngine(2);
    const f = await engine.submit({ requestId: "big", promptTokens: new Array(20).fill(1), sampling: greedy });
    expect(f.reason).toBe("error");
    expect(f.error).toMatch(/does not fit/);
    expect(pool.used).toBe(0);
  });
});
