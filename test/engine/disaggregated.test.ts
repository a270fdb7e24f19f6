import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { loadModel, startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER } from "../../src/http/index.ts";
import { fakeServedModel, sseEvents, GATEWAY_TUNING } from "../support/nodes.ts";

const B = 4;
let P: EngineNode, D: EngineNode, C: EngineNode;

beforeAll(async () => {
  const common = { blockTokens: B, numBlocks: 64 };
  [P, D, C] = await Promise.all([
    startEngineNode({ role: "prefill", model: fakeServedModel(), ...common }),
    startEngineNode({ role: "decode", model: fakeServedModel(), ...common }),
    startEngineNode({ role: "both", model: fakeServedModel(), ...common }),
  ]);
});
afterAll(async () => {
  await Promise.all([P, D, C].map((n) => n?.shutdown()));
});

interface Trio {
  P: EngineNode;
  D: EngineNode;
  C: EngineNode;
}

const fakes = (): Trio => ({ P, D, C });

async function colocated(prompt: number[], sampling: Record<string, unknown>, t: Trio = fakes()): Promise<number[]> {
  const res = await fetch(`http://${t.C.httpAddress}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ prompt, max_tokens: 12, return_token_ids: true, ...sampling }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { choices: { token_ids: number[] }[] };
  return body.choices[0]!.token_ids;
}

async function disaggregated(prompt: number[], sampling: { temperature: number; seed?: number }, stream: boolean, t: Trio = fakes()) {
  const { P, D } = t;
  const control = grpcClient(EngineControl, P.grpcAddress, { timeoutMs: 10_000 });
  const handle = await control.prefill(
    create(PrefillRequestSchema, {
      requestId: `req-${Math.random()}`,
      promptTokens: prompt,
      sampling: { temperature: sampling.temperature, maxTokens: 12, seed: sampling.seed === undefined ? undefined : BigInt(sampling.seed) },
      decodeTarget: D.kvAddress,
      kvFormat: 1,
    }),
  );
  expect(P.pool.used).toBe(0); // P dropped its references after the push
  expect(handle.promptTokens).toEqual(prompt);
  expect(handle.rngDrawsConsumed).toBe(sampling.temperature > 0 ? 1 : 0);
  const res = await fetch(`http://${D.httpAddress}/v1/completions`, {
    method: "POST",
    headers: {
      [HANDLE_HEADER]: handle.handleId,
      [FIRST_TOKEN_HEADER]: String(handle.firstToken),
      [DRAWS_HEADER]: String(handle.rngDrawsConsumed),
    },
    body: JSON.stringify({
      prompt: handle.promptTokens,
      max_tokens: 12,
      temperature: sampling.temperature,
      seed: handle.seed.toString(),
      stream,
      return_token_ids: true,
    }),
  });
  expect(res.status).toBe(200);
  let rest: number[];
  if (stream) {
    const events = (await sseEvents(res)) as ({ choices: { token_ids?: number[] }[] } | string)[];
    expect(events.at(-1)).toBe("[DONE]");
    rest = events.flatMap((e) => (typeof e === "string" ? [] : e.choices.flatMap((c) => c.token_ids ?? [])));
  } else {
    rest = ((await res.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
  }
  return { handle, tokens: [handle.firstToken, ...rest] };
}

const prompts = {
  "shorter than a block": [65, 66, 67],
  "ending on a block boundary": [72, 101, 108, 108, 111, 44, 32, 119],
  "with a tail": [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98],
};

describe("disaggregated equals colocated", () => {
  for (const [name, prompt] of Object.entries(prompts)) {
    for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 7 }, { temperature: 1.3, seed: 123456789 }]) {
      test(`${name}, ${sampling.temperature === 0 ? "greedy" : `seed ${sampling.seed}`}`, async () => {
        const want = await colocated(prompt, sampling);
        expect(want.length).toBe(12);
        for (const stream of [false, true]) {
          const got = await disaggregated(prompt, sampling, stream);
          expect(got.tokens).toEqual(want);
        }
        expect(D.pool.used).toBe(0);
        expect(D.receiver!.pending()).toBe(0);
      });
    }
  }
});

describe("disaggregated equals colocated across thread counts", () => {
  // The real synthetic model, P on 2 threads, D on 3, the colocated engine on 1: every matmul
  // of its 256-wide layers is split, and the tokens must not notice. P and D run the model on
  // a thread of its own, the colocated engine on its event loop: nor must that.
  let T: Trio;
  beforeAll(async () => {
    const common = { blockTokens: B, numBlocks: 64 };
    const where = ["worker", "worker", "main"] as const;
    const [tp, td, tc] = await Promise.all([2, 3, 1].map((threads, i) => loadModel({ threads, modelThread: where[i] })));
    const [p, d, c] = await Promise.all([
      startEngineNode({ role: "prefill", model: tp, ...common }),
      startEngineNode({ role: "decode", model: td, ...common }),
      startEngineNode({ role: "both", model: tc, ...common }),
    ]);
    T = { P: p, D: d, C: c };
    expect([tp!.threads, td!.threads, tc!.threads]).toEqual([2, 3, 1]);
    expect([tp!.sharedSlab, td!.sharedSlab, tc!.sharedSlab]).toEqual([true, true, undefined]);
  });
  afterAll(async () => {
    await Promise.all(Object.values(T ?? {}).map((n) => n.shutdown()));
    for (const n of Object.values(T ?? {})) n.model.close?.();
  });
  for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 7 }]) {
    test(`${sampling.temperature === 0 ? "greedy" : `seed ${sampling.seed}`}`, async () => {
      const prompt = prompts["with a tail"];
      const want = await colocated(prompt, sampling, T);
      expect(want.length).toBe(12);
      const got = await disaggregated(prompt, sampling, false, T);
      expect(got.tokens).toEqual(want);
    });
  }
});

describe("the decode side of the hand-off", () => {
  test("an unknown handle is 404, a mismatched prompt 409 and the handle stays for the right resume", async () => {
    const post = (headers: Record<string, string>, prompt: number[]) =>
      fetch(`http://${D.httpAddress}/v1/completions`, {
        method: "POST",
        headers: { [FIRST_TOKEN_HEADER]: "1", [DRAWS_HEADER]: "0", ...headers },
        body: JSON.stringify({ prompt, max_tokens: 4, temperature: 0 }),
      });
    const unknown = await post({ [HANDLE_HEADER]: "nope" }, [1, 2, 3]);
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { message: string } }).error.message).toMatch(/unknown or expired/);

    const { handle } = await disaggregated(prompts["with a tail"], { temperature: 0 }, false);
    // the handle above was claimed; push another and resume it with a different prompt
    const control = grpcClient(EngineControl, P.grpcAddress);
    const h2 = await control.prefill(
      create(PrefillRequestSchema, {
        requestId: "mismatch",
        promptTokens: handle.promptTokens,
        sampling: { maxTokens: 8 },
        decodeTarget: D.kvAddress,
        kvFormat: 1,
      }),
    );
    expect(D.receiver!.pending()).toBe(1);
    const other = [...handle.promptTokens];
    other[0] = 90;
    const conflict = await post({ [HANDLE_HEADER]: h2.handleId }, other);
    expect(conflict.status).toBe(409);
    const message = ((await conflict.json()) as { error: { message: string } }).error.message;
    expect(message).toMatch(/block hashes differ/);
    expect(message).not.toContain(h2.handleId);
    // A wrong resume cannot destroy another request's KV: the handle is still there...
    expect(D.receiver!.pending()).toBe(1);
    expect(D.pool.used).toBeGreaterThan(0);
    // ...and the right resume takes it
    const right = await post(
      { [HANDLE_HEADER]: h2.handleId, [FIRST_TOKEN_HEADER]: String(h2.firstToken), [DRAWS_HEADER]: String(h2.rngDrawsConsumed) },
      handle.promptTokens,
    );
    expect(right.status).toBe(200);
    await right.text();
    expect(D.receiver!.pending()).toBe(0);
    for (let i = 0; i < 100 && D.pool.used > 0; i++) await Bun.sleep(10);
    expect(D.pool.used).toBe(0);
    expect(h2.handleId).toMatch(/^[0-9a-f]{32}$/);
  });
});

describe("disaggregated_equals_colocated with the default model", () => {
  test("the same text through HTTP: gateway over P and D versus one engine", async () => {
    const { startGateway } = await import("../../src/gateway/index.ts");
    const { chatRendererFor } = await import("../../src/tokenizer/index.ts");
    const { loadTokenizerFor } = await import("../../src/model/index.ts");
    // The gateway tokenizes and renders chat prompts as the engines' default model does (tl-kjv-small).
    const m = await loadTokenizerFor({});
    const chat = chatRendererFor(m.tokenizer, m.chatTemplate);
    const gw = await startGateway({
      ...GATEWAY_TUNING,
      tokenizer: m.tokenizer,
      chat,
      modelName: m.name,
      maxModelLen: m.maxSeqLen,
      heartbeatIntervalMs: 100,
    });
    const opts = { blockTokens: 16, numBlocks: 64, gatewayRegistry: gw.registryAddress, heartbeatIntervalMs: 100 };
    const [p, d, c] = await Promise.all([
      startEngineNode({ role: "prefill", ...opts }),
      startEngineNode({ role: "decode", ...opts }),
      startEngineNode({ role: "both", blockTokens: 16, numBlocks: 64 }),
    ]);
    try {
      while (gw.registry.live().length < 2) await Bun.sleep(10);
      for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 31 }, { temperature: 0.7, seed: 5 }]) {
        const body = JSON.stringify({ messages: [{ role: "user", content: "Tell me about KV caches, please." }], max_tokens: 12, ...sampling });
        const want = (await (await fetch(`http://${c.httpAddress}/v1/chat/completions`, { method: "POST", body })).json()) as {
          choices: { message: { content: string } }[];
        };
        const res = await fetch(`http://${gw.httpAddress}/v1/chat/completions`, { method: "POST", body });
        expect(res.headers.get("x-tl-served")).toBe("disaggregated");
        const got = (await res.json()) as { choices: { message: { content: string } }[] };
        expect(got.choices[0]!.message.content).toBe(want.choices[0]!.message.content);
        expect(want.choices[0]!.message.content.length).toBeGreaterThan(0);
      }
    } finally {
      await Promise.all([p.shutdown(), d.shutdown(), c.shutdown()]);
      await gw.stop();
    }
  });
});
