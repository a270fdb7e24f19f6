import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { TextAssembler } from "../../src/http/index.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel, sseEvents } from "../support/nodes.ts";

let E: EngineNode;
beforeAll(async () => {
  E = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 64, maxModelLen: 300 });
});
afterAll(() => E?.shutdown());

const url = (p: string) => `http://${E.httpAddress}${p}`;
const post = (p: string, body: unknown, init: RequestInit = {}) => fetch(url(p), { method: "POST", body: JSON.stringify(body), ...init });

describe("engine HTTP (OpenAI-compatible)", () => {
  test("models, health, and errors in OpenAI's shape with the right status", async () => {
    expect(await (await fetch(url("/v1/models"))).json()).toMatchObject({ object: "list", data: [{ id: "fake", object: "model" }] });
    expect(await (await fetch(url("/health"))).json()).toMatchObject({ status: "ok", roles: ["prefill", "decode"] });
    const cases: [unknown, number, RegExp][] = [
      [{ prompt: "x", max_tokens: 0 }, 400, /max_tokens/],
      [{ prompt: "x", n: 17 }, 400, /\bn must be an integer in \[1, 16\]/],
      [{ prompt: [1, 999] }, 400, /outside the vocabulary/],
      [{ prompt: "x", stop: 5 }, 400, /stop/],
      [{ prompt: "x", top_p: 2 }, 400, /top_p|topP|top-p/i],
      [{ prompt: "x", seed: -1 }, 400, /seed/],
      [{ prompt: "x", max_tokens: 400 }, 400, /exceeds the model's context/],
      [{ prompt: "x", model: "gpt-4" }, 404, /not served/],
      [{ messages: [] }, 400, /messages/],
    ];
    for (const [body, status, msg] of cases) {
      const path = "messages" in (body as object) ? "/v1/chat/completions" : "/v1/completions";
      const r = await post(path, body);
      const j = (await r.json()) as { error: { message: string; type: string } };
      expect({ body, status: r.status, msg: msg.test(j.error.message) }).toEqual({ body, status, msg: true });
    }
    expect((await fetch(url("/nope"))).status).toBe(404);
    expect((await post("/v1/completions", "{", {})).status).toBe(400);
  });

  test("completion and chat, JSON and SSE, agree on the text, usage and finish_reason", async () => {
    const body = { prompt: "Hello there", max_tokens: 9, temperature: 0.7, seed: 11 };
    const j = (await (await post("/v1/completions", body)).json()) as {
      object: string;
      choices: { text: string; finish_reason: string }[];
      usage: Record<string, number>;
    };
    expect(j.object).toBe("text_completion");
    expect(j.usage).toEqual({ prompt_tokens: 12, completion_tokens: 9, total_tokens: 21 });
    expect(j.choices[0]!.finish_reason).toBe("length");
    const events = (await sseEvents(await post("/v1/completions", { ...body, stream: true, stream_options: { include_usage: true } }))) as (
      | { choices: { text: string; finish_reason: string | null }[]; usage?: unknown }
      | string
    )[];
    expect(events.at(-1)).toBe("[DONE]");
    const chunks = events.filter((e): e is Exclude<typeof e, string> => typeof e !== "string");
    expect(chunks.flatMap((c) => c.choices.map((x) => x.text)).join("")).toBe(j.choices[0]!.text);
    expect(chunks.at(-1)!.usage).toEqual(j.usage);
    const chat = (await sseEvents(
      await post("/v1/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 5, stream: true, seed: 11 }),
    )) as ({ object: string; choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[] } | string)[];
    const first = chat[0] as Exclude<(typeof chat)[0], string>;
    expect(first.object).toBe("chat.completion.chunk");
    expect(first.choices[0]!.delta.role).toBe("assistant");
    const last = chat.at(-2) as Exclude<(typeof chat)[0], string>;
    expect(last.choices[0]!.finish_reason).toBe("length");
  });

  test("token_ids_always: the JSON choice and the final chunk carry the generated ids without return_token_ids", async () => {
    type Chunk = { choices: { token_ids?: number[]; finish_reason: string | null }[] };
    for (const [path, base] of [
      ["/v1/completions", { prompt: "Hello there" }],
      ["/v1/chat/completions", { messages: [{ role: "user", content: "hi" }] }],
    ] as const) {
      const body = { ...base, max_tokens: 7, temperature: 0.7, seed: 3 };
      const want = ((await (await post(path, { ...body, return_token_ids: true })).json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
      expect(want.length).toBe(7);
      const j = (await (await post(path, body)).json()) as { choices: { token_ids: number[] }[] };
      expect({ path, ids: j.choices[0]!.token_ids }).toEqual({ path, ids: want });
      const chunks = ((await sseEvents(await post(path, { ...body, stream: true }))) as (Chunk | string)[]).filter((e): e is Chunk => typeof e !== "string");
      const last = chunks.at(-1)!.choices[0]!;
      expect({ path, finish: last.finish_reason, ids: last.token_ids }).toEqual({ path, finish: "length", ids: want });
      expect(chunks.slice(0, -1).every((c) => c.choices[0]!.token_ids === undefined)).toBe(true);
      // With return_token_ids each chunk carries its own ids, and the final one the (empty) rest: they add up once.
      const each = ((await sseEvents(await post(path, { ...body, stream: true, return_token_ids: true }))) as (Chunk | string)[]).filter(
        (e): e is Chunk => typeof e !== "string",
      );
      expect(each.flatMap((c) => c.choices[0]!.token_ids ?? [])).toEqual(want);
      expect(each.at(-1)!.choices[0]!.token_ids).toEqual([]);
    }
  });

  test("a stop string ends the text before it, in JSON and in a stream", async () => {
    const base = (await (await post("/v1/completions", { prompt: "stop test", max_tokens: 30, temperature: 0 })).json()) as { choices: { text: string }[] };
    const text = base.choices[0]!.text;
    const stop = text.slice(5, 7);
    const want = text.slice(0, text.indexOf(stop));
    const j = (await (await post("/v1/completions", { prompt: "stop test", max_tokens: 30, temperature: 0, stop })).json()) as {
      choices: { text: string; finish_reason: string }[];
    };
    expect(j.choices[0]).toMatchObject({ text: want, finish_reason: "stop" });
    const events = (await sseEvents(await post("/v1/completions", { prompt: "stop test", max_tokens: 30, temperature: 0, stop, stream: true }))) as (
      | { choices: { text: string; finish_reason: string | null }[] }
      | string
    )[];
    expect(events.flatMap((e) => (typeof e === "string" ? [] : e.choices.map((c) => c.text))).join("")).toBe(want);
    await Bun.sleep(20);
    expect(E.pool.used).toBe(0);
  });

  test("TextAssembler holds back a possible stop string and stitches split UTF-8", () => {
    const tok = new ByteTokenizer();
    const a = new TextAssembler(tok, ["END"], []);
    const bytes = [...new TextEncoder().encode("héllo EN"), ...new TextEncoder().encode("D more")];
    let out = "";
    for (const b of bytes) out += a.push(b);
    expect(out).toBe("héllo ");
    expect(a.stopped).toBe(true);
    const b = new TextAssembler(tok, ["xyz"], []);
    expect([...new TextEncoder().encode("é")].map((x) => b.push(x))).toEqual(["", ""]); // the last len("xyz") - 1 chars wait
    expect([b.push(0x78), b.push(0x79)]).toEqual(["", "é"]);
    expect(b.flush()).toBe("xy");
  });

  test("a client that disconnects mid-stream cancels its request and frees its blocks", async () => {
    (E.model.runner as FakeRunner).slowMs = 3;
    try {
      const ac = new AbortController();
      const res = await post("/v1/completions", { prompt: "disconnect me", max_tokens: 250, temperature: 0, stream: true }, { signal: ac.signal });
      const reader = res.body!.getReader();
      await reader.read();
      await reader.read();
      expect(E.engine.inFlight).toBe(1);
      expect(E.pool.used).toBeGreaterThan(0);
      ac.abort();
      const end = Date.now() + 2000;
      while ((E.engine.inFlight > 0 || E.pool.used > 0) && Date.now() < end) await Bun.sleep(5);
      expect([E.engine.inFlight, E.pool.used]).toEqual([0, 0]);
    } finally {
      (E.model.runner as FakeRunner).slowMs = 0;
    }
  });
});
