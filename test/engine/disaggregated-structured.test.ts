import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { loadModel, startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { type Gateway, startGateway } from "../../src/gateway/index.ts";
import { constraintHash } from "../../src/grammar/index.ts";
import { CONSTRAINT_HEADER, DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER } from "../../src/http/index.ts";
import { chatRendererFor } from "../../src/tokenizer/index.ts";
import { loadTokenizerFor } from "../../src/model/index.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { GATEWAY_TUNING, sseEvents } from "../support/nodes.ts";
import { schemaViolation } from "../support/schema-check.ts";

// The embedded model, P on 2 threads and D on 3 (each on a model thread), the colocated engine on
// 1 (on its event loop): a seeded constrained request must give the same bytes either way.
let P: EngineNode, D: EngineNode, C: EngineNode;
let gw: Gateway;
beforeAll(async () => {
  const m = await loadTokenizerFor({});
  gw = await startGateway({
    ...GATEWAY_TUNING,
    tokenizer: m.tokenizer,
    chat: chatRendererFor(m.tokenizer, m.chatTemplate),
    modelName: m.name,
    maxModelLen: m.maxSeqLen,
    // What this tests is the bytes, not the failure detector: a loaded machine must not route around P or D.
    heartbeatIntervalMs: 1000,
    stallSuspectMs: 30_000,
  });
  const opts = { blockTokens: 16, numBlocks: 64, gatewayRegistry: gw.registryAddress, heartbeatIntervalMs: 1000 };
  const [tp, td, tc] = await Promise.all([
    loadModel({ threads: 2, modelThread: "worker" }),
    loadModel({ threads: 3, modelThread: "worker" }),
    loadModel({ threads: 1, modelThread: "main" }),
  ]);
  [P, D, C] = await Promise.all([
    startEngineNode({ role: "prefill", model: tp, ...opts }),
    startEngineNode({ role: "decode", model: td, ...opts }),
    startEngineNode({ role: "both", model: tc, blockTokens: 16, numBlocks: 64 }),
  ]);
  while (gw.registry.live().length < 2) await Bun.sleep(10);
});
afterAll(async () => {
  await Promise.all([P, D, C].map((n) => n?.shutdown()));
  for (const n of [P, D, C]) n?.model.close?.();
  await gw?.stop();
});

const PERSON = {
  type: "object",
  properties: { name: { type: "string", maxLength: 10 }, age: { type: "integer", minimum: 0, maximum: 120 } },
  required: ["name", "age"],
  additionalProperties: false,
};
const WEATHER = { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"], additionalProperties: false };
const TOOLS = [{ type: "function", function: { name: "get_weather", parameters: WEATHER } }];

/** A response as bytes that must not differ: the text (or tool calls without their fresh ids), the token ids, the finish. */
async function answer(address: string, body: Record<string, unknown>, stream: boolean) {
  const res = await fetch(`http://${address}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ ...body, stream }) });
  if (res.status !== 200) throw new Error(`${res.status} ${await res.text()}`);
  const served = res.headers.get("x-tl-served");
  type Call = { function: { name: string; arguments: string } };
  if (!stream) {
    const c = ((await res.json()) as { choices: { message: { content: string | null; tool_calls?: Call[] }; token_ids: number[]; finish_reason: string }[] })
      .choices[0]!;
    return { served, content: c.message.content, calls: (c.message.tool_calls ?? []).map((t) => t.function), ids: c.token_ids, finish: c.finish_reason };
  }
  let content = "";
  const calls: Call["function"][] = [];
  const ids: number[] = [];
  let finish = "";
  for (const e of await sseEvents(res)) {
    if (typeof e === "string") continue;
    const c = (e as { choices: { delta: { content?: string | null; tool_calls?: Call[] }; token_ids?: number[]; finish_reason: string | null }[] }).choices[0];
    if (!c) continue;
    content += c.delta.content ?? "";
    for (const t of (c.delta.tool_calls ?? []) as (Call & { index: number; id?: string })[]) {
      if (t.id !== undefined) calls.push({ ...t.function });
      else calls[t.index]!.arguments += t.function.arguments;
    }
    ids.push(...(c.token_ids ?? []));
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { served, content: content === "" ? null : content, calls, ids, finish };
}

const CASES: { name: string; body: Record<string, unknown>; check: (a: Awaited<ReturnType<typeof answer>>) => void }[] = [
  {
    name: "json_schema",
    body: { response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON } } },
    check: (a) => expect(schemaViolation(PERSON, JSON.parse(a.content!))).toBeNull(),
  },
  {
    name: "regex",
    body: { guided_regex: "[A-Z][a-z]{1,8} [0-9]{1,3}:[0-9]{1,3}" },
    check: (a) => expect(a.content).toMatch(/^[A-Z][a-z]{1,8} [0-9]{1,3}:[0-9]{1,3}$/),
  },
  {
    name: "a named tool call",
    body: { tools: TOOLS, tool_choice: { type: "function", function: { name: "get_weather" } } },
    check: (a) => {
      expect(a.finish).toBe("tool_calls");
      expect(schemaViolation(WEATHER, JSON.parse(a.calls[0]!.arguments))).toBeNull();
    },
  },
  {
    name: "a required tool call",
    body: { tools: TOOLS, tool_choice: "required", parallel_tool_calls: false },
    check: (a) => expect(a.calls.map((c) => c.name)).toEqual(["get_weather"]),
  },
];

describe("a seeded constrained request: disaggregated == colocated", () => {
  for (const c of CASES) {
    test(c.name, async () => {
      for (const [seed, stream] of [
        [7, false],
        [8, true],
      ] as const) {
        const body = { messages: [{ role: "user", content: "Who spake unto Moses?" }], max_tokens: 80, temperature: 0.9, seed, ...c.body };
        const want = await answer(C.httpAddress, body, stream);
        const got = await answer(gw.httpAddress, body, stream);
        expect(got.served).toBe("disaggregated");
        expect({ ...got, served: null }).toEqual({ ...want, served: null });
        c.check(got);
      }
      expect(D.receiver!.pending()).toBe(0);
    });
  }
});

test("n = 2 under a JSON schema: one prefill samples both first tokens under the mask, each choice continues under its own matcher", async () => {
  const body = JSON.stringify({
    messages: [{ role: "user", content: "Who spake unto Moses?" }],
    max_tokens: 80,
    temperature: 1.1,
    seed: 21,
    n: 2,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON } },
  });
  type Body = { choices: { index: number; message: { content: string }; token_ids: number[] }[] };
  const want = (await (await fetch(`http://${C.httpAddress}/v1/chat/completions`, { method: "POST", body })).json()) as Body;
  const res = await fetch(`http://${gw.httpAddress}/v1/chat/completions`, { method: "POST", body });
  expect(res.headers.get("x-tl-served")).toBe("disaggregated");
  const got = (await res.json()) as Body;
  expect(got.choices.map((c) => c.token_ids)).toEqual(want.choices.map((c) => c.token_ids));
  expect(got.choices[0]!.token_ids).not.toEqual(got.choices[1]!.token_ids);
  for (const c of got.choices) expect(schemaViolation(PERSON, JSON.parse(c.message.content))).toBeNull();
});

test("through the gateway, a grammar that does not compile is a 400 before any engine works", async () => {
  const before = [P, D, C].map((n) => n.engine.stats.prefillTokens);
  const res = await fetch(`http://${gw.httpAddress}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ prompt: "In the beginning", max_tokens: 8, grammar: 'root ::= "a" undefined_rule' }),
  });
  expect(res.status).toBe(400);
  expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/does not compile/);
  expect([P, D, C].map((n) => n.engine.stats.prefillTokens)).toEqual(before);
});

describe("the constraint across the hand-off", () => {
  const prompt = [0, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317];
  const prefill = (requestId: string, structured?: { kind: string; source: string }) =>
    grpcClient(EngineControl, P.grpcAddress, { timeoutMs: 10_000 }).prefill(
      create(PrefillRequestSchema, {
        requestId,
        promptTokens: prompt,
        sampling: { temperature: 0.9, maxTokens: 20, seed: 3n },
        decodeTarget: D.kvAddress,
        kvFormat: 1,
        ...(structured ? { structured } : {}),
      }),
    );
  const resume = (h: { handleId: string; firstToken: number; rngDrawsConsumed: number }, hash: string, so: Record<string, unknown>) =>
    fetch(`http://${D.httpAddress}/v1/completions`, {
      method: "POST",
      headers: {
        [HANDLE_HEADER]: h.handleId,
        [FIRST_TOKEN_HEADER]: String(h.firstToken),
        [DRAWS_HEADER]: String(h.rngDrawsConsumed),
        [CONSTRAINT_HEADER]: hash,
      },
      body: JSON.stringify({ prompt, max_tokens: 20, temperature: 0.9, seed: "3", structured_outputs: so, return_token_ids: true }),
    });

  test("Prefill with a grammar that does not compile is INVALID_ARGUMENT before any prefill", async () => {
    const before = P.engine.stats.prefillTokens;
    const e = await prefill("bad-grammar", { kind: "grammar", source: "root ::= nowhere" }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConnectError);
    expect((e as ConnectError).code).toBe(Code.InvalidArgument);
    expect((e as ConnectError).rawMessage).toMatch(/does not compile/);
    expect(P.engine.stats.prefillTokens).toBe(before);
  });

  test("the handle names the constraint; P's first token is the grammar's; D replays it", async () => {
    const spec = { kind: "regex", source: "[0-9]{4}" } as const;
    const h = await prefill("regex-1", spec);
    expect(h.constraintHash).toBe(constraintHash(spec));
    const res = await resume(h, h.constraintHash, { regex: "[0-9]{4}" });
    expect(res.status).toBe(200);
    const rest = ((await res.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
    const { tokenizer } = await loadTokenizerFor({});
    expect(tokenizer.decode([h.firstToken, ...rest])).toMatch(/^[0-9]{4}$/);
  });

  test("a resume whose constraint is not the handle's is a 400 and the handle stays for the right one", async () => {
    const h = await prefill("regex-2", { kind: "regex", source: "[0-9]{4}" });
    const wrong = await resume(h, h.constraintHash, { regex: "[a-z]{4}" });
    expect(wrong.status).toBe(400);
    expect(D.receiver!.pending()).toBe(1);
    const right = await resume(h, h.constraintHash, { regex: "[0-9]{4}" });
    expect(right.status).toBe(200);
    await right.text();
    expect(D.receiver!.pending()).toBe(0);
  });

  test("a D that cannot compile the grammar refuses with 412 (FAILED_PRECONDITION) and frees the blocks", async () => {
    const h = await prefill("no-compile", { kind: "regex", source: "[0-9]{4}" });
    expect(D.pool.used).toBeGreaterThan(0);
    // What D is asked to continue under does not compile there (as on a D of another build).
    const so = { grammar: "root ::= undefined_rule" };
    const res = await resume(h, constraintHash({ kind: "grammar", source: so.grammar }), so);
    expect(res.status).toBe(412);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe("failed_precondition");
    expect(D.receiver!.pending()).toBe(0);
    for (let i = 0; i < 100 && D.pool.used > 0; i++) await Bun.sleep(10);
    expect(D.pool.used).toBe(0);
  });
});
