import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { LIMITS } from "../../src/http/index.ts";
import { fakeServedModel, sseEvents } from "../support/nodes.ts";

// Each parameter against a baseline on one engine (the fake model: logits in [0, 4) over
// 258 byte tokens, so a bias of +4.01 makes a token the argmax whatever the context).
let E: EngineNode;
beforeAll(async () => {
  E = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 256, maxModelLen: 300 });
});
afterAll(() => E?.shutdown());

const EOS = 257;
type Choice = { index: number; text: string; token_ids: number[]; finish_reason: string; logprobs: unknown; message?: { content: string } };
type Body = { choices: Choice[]; usage: { prompt_tokens: number; completion_tokens: number } };

async function complete(body: Record<string, unknown>, path = "/v1/completions"): Promise<Body> {
  const res = await fetch(`http://${E.httpAddress}${path}`, { method: "POST", body: JSON.stringify({ max_tokens: 12, return_token_ids: true, ...body }) });
  const j = await res.json();
  expect({ status: res.status, j }).toMatchObject({ status: 200 });
  return j as Body;
}
const ids = async (body: Record<string, unknown>) => (await complete(body)).choices[0]!.token_ids;

async function refused(body: Record<string, unknown>, path = "/v1/completions"): Promise<{ message: string; param: string | null }> {
  const res = await fetch(`http://${E.httpAddress}${path}`, { method: "POST", body: JSON.stringify(body) });
  const j = (await res.json()) as { error: { message: string; param: string | null } };
  expect({ body, status: res.status }).toEqual({ body, status: 400 });
  return j.error;
}

const A = 65;
const prompt = [72, 105, 33];

describe("penalties and logit_bias change the tokens as vLLM's do", () => {
  test("logit_bias makes a token the argmax, and -100 bans it", async () => {
    expect(await ids({ prompt, temperature: 0, logit_bias: { [A]: 4.01 } })).toEqual(Array(12).fill(A));
    const base = await ids({ prompt, temperature: 0 });
    const banned = await ids({ prompt, temperature: 0, logit_bias: { [base[0]!]: -100 } });
    expect(banned[0]).not.toBe(base[0]);
  });

  test("presence and frequency penalties act on output tokens only", async () => {
    const forced = { prompt, temperature: 0, logit_bias: { [A]: 4.01 } };
    for (const p of [{ presence_penalty: 2 }, { frequency_penalty: 2 }]) {
      const got = await ids({ ...forced, ...p });
      expect(got[0]).toBe(A); // nothing in the output yet: the prompt does not count
      expect(got.some((t) => t !== A)).toBe(true);
    }
    // Negative values reward repeats: a banned-by-bias token that already occurred comes back.
    expect(await ids({ ...forced, presence_penalty: -2 })).toEqual(Array(12).fill(A));
  });

  test("repetition_penalty counts prompt tokens: a positive logit is divided", async () => {
    const withA = [A, 66, 67];
    expect((await ids({ prompt: withA, temperature: 0, logit_bias: { [A]: 4.01 } }))[0]).toBe(A);
    expect((await ids({ prompt: withA, temperature: 0, logit_bias: { [A]: 4.01 }, repetition_penalty: 3 }))[0]).not.toBe(A);
    // Not in the prompt: the first token is untouched.
    expect((await ids({ prompt, temperature: 0, logit_bias: { [A]: 4.01 }, repetition_penalty: 3 }))[0]).toBe(A);
  });

  test("seeded sampling with penalties is reproducible and differs from without", async () => {
    const s = { prompt, temperature: 0.8, seed: 5, max_tokens: 20 };
    const a = await ids({ ...s, frequency_penalty: 1.5, logit_bias: { [A]: 3 } });
    expect(await ids({ ...s, frequency_penalty: 1.5, logit_bias: { [A]: 3 } })).toEqual(a);
    expect(await ids(s)).not.toEqual(a);
  });
});

describe("min_tokens, ignore_eos and stop_token_ids", () => {
  const eosFirst = { prompt, temperature: 0, logit_bias: { [EOS]: 100 } };
  test("EOS ends at once; min_tokens holds it back; ignore_eos runs to max_tokens", async () => {
    const plain = await complete(eosFirst);
    expect([plain.choices[0]!.token_ids, plain.choices[0]!.finish_reason]).toEqual([[EOS], "stop"]);
    const held = (await complete({ ...eosFirst, min_tokens: 4 })).choices[0]!;
    expect(held.token_ids.length).toBe(5);
    expect(held.token_ids.slice(0, 4)).not.toContain(EOS);
    expect([held.token_ids[4], held.finish_reason]).toEqual([EOS, "stop"]);
    const ignored = (await complete({ ...eosFirst, ignore_eos: true, max_tokens: 6 })).choices[0]!;
    expect([ignored.token_ids, ignored.finish_reason]).toEqual([Array(6).fill(EOS), "length"]);
  });

  test("stop_token_ids end the request, and min_tokens masks them too", async () => {
    const base = await ids({ prompt, temperature: 0 });
    const stopped = (await complete({ prompt, temperature: 0, stop_token_ids: [base[3]!] })).choices[0]!;
    expect([stopped.token_ids, stopped.finish_reason]).toEqual([base.slice(0, 4), "stop"]);
    const forced = { prompt, temperature: 0, logit_bias: { 70: 100 }, stop_token_ids: [70] };
    expect(await ids(forced)).toEqual([70]);
    expect((await ids({ ...forced, min_tokens: 3 })).length).toBe(4);
  });

  test("stop strings are not looked for before min_tokens (vLLM)", async () => {
    const base = await complete({ prompt, temperature: 0, max_tokens: 10 });
    const text = base.choices[0]!.text;
    const stop = text.slice(0, 1);
    expect((await complete({ prompt, temperature: 0, max_tokens: 10, stop })).choices[0]!.finish_reason).toBe("stop");
    const late = (await complete({ prompt, temperature: 0, max_tokens: 10, stop, min_tokens: 8 })).choices[0]!;
    expect(late.text.startsWith(stop)).toBe(true);
    expect(late.token_ids.length).toBeGreaterThanOrEqual(8);
  });

  test("include_stop_str_in_output keeps the stop string", async () => {
    const text = (await complete({ prompt, temperature: 0, max_tokens: 30 })).choices[0]!.text;
    const stop = text.slice(4, 6);
    const cut = text.indexOf(stop);
    expect((await complete({ prompt, temperature: 0, max_tokens: 30, stop })).choices[0]!.text).toBe(text.slice(0, cut));
    expect((await complete({ prompt, temperature: 0, max_tokens: 30, stop, include_stop_str_in_output: true })).choices[0]!.text).toBe(
      text.slice(0, cut + stop.length),
    );
  });
});

describe("logprobs", () => {
  test("completions: tokens, token_logprobs, top_logprobs, text_offset; the greedy token is the top one", async () => {
    const j = await complete({ prompt, temperature: 0, max_tokens: 6, logprobs: 3 });
    const c = j.choices[0]!;
    const lp = c.logprobs as { tokens: string[]; token_logprobs: number[]; top_logprobs: Record<string, number>[]; text_offset: number[] };
    expect(lp.tokens.length).toBe(6);
    expect(lp.tokens.join("")).toBe(c.text);
    expect(lp.text_offset[0]).toBe(0);
    for (let i = 0; i < 6; i++) {
      const top = Object.values(lp.top_logprobs[i]!);
      expect(top.length).toBeGreaterThanOrEqual(1); // keyed by text: bytes that decode alike collapse
      expect(lp.token_logprobs[i]).toBe(Math.max(...top));
      expect(lp.token_logprobs[i]!).toBeLessThan(0);
      if (i > 0) expect(lp.text_offset[i]).toBe(lp.text_offset[i - 1]! + lp.tokens[i - 1]!.length);
    }
    expect((await complete({ prompt, temperature: 0, max_tokens: 6 })).choices[0]!.logprobs).toBeNull();
  });

  test("chat: content[{token, logprob, bytes, top_logprobs}], JSON and stream agree", async () => {
    const body = { messages: [{ role: "user", content: "hi" }], temperature: 0.7, seed: 3, max_tokens: 5, logprobs: true, top_logprobs: 2 };
    const j = await complete(body, "/v1/chat/completions");
    const content = (
      j.choices[0]!.logprobs as {
        content: { token: string; logprob: number; bytes: number[]; top_logprobs: { token: string; logprob: number; bytes: number[] }[] }[];
      }
    ).content;
    expect(content.length).toBe(5);
    for (const e of content) {
      expect(e.top_logprobs.length).toBe(2);
      expect(e.top_logprobs[0]!.logprob).toBeGreaterThanOrEqual(e.top_logprobs[1]!.logprob);
      expect(e.top_logprobs[0]!.logprob).toBeGreaterThanOrEqual(e.logprob);
      expect(new TextDecoder().decode(new Uint8Array(e.bytes))).toBe(e.token);
    }
    const res = await fetch(`http://${E.httpAddress}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ ...body, stream: true }) });
    const events = (await sseEvents(res)).filter((e): e is { choices: { logprobs: { content: unknown[] } | null }[] } => typeof e !== "string");
    expect(events.flatMap((e) => e.choices[0]?.logprobs?.content ?? [])).toEqual(content);
    // Without logprobs: true, top_logprobs is refused (as OpenAI does).
    expect((await refused({ ...body, logprobs: false }, "/v1/chat/completions")).param).toBe("top_logprobs");
  });

  test("a masked token's logprob is -9999, not null", async () => {
    const c = (await complete({ prompt, temperature: 0, max_tokens: 2, logprobs: 0, logit_bias: { [A]: 100 } })).choices[0]!;
    // Raw logprobs (vLLM's default): the bias forced A, the model's own logprob of A stays finite.
    expect((c.logprobs as { token_logprobs: number[] }).token_logprobs.every((x) => Number.isFinite(x))).toBe(true);
  });
});

describe("n, prompt lists, echo", () => {
  test("n = 3: choice j is the request with seed + j", async () => {
    const j = await complete({ prompt, temperature: 1, seed: 40, n: 3 });
    expect(j.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    for (let k = 0; k < 3; k++) expect(j.choices[k]!.token_ids).toEqual(await ids({ prompt, temperature: 1, seed: 40 + k }));
    expect(new Set(j.choices.map((c) => c.token_ids.join())).size).toBe(3);
    expect(j.usage.completion_tokens).toBe(36);
    const best = await complete({ prompt, temperature: 1, seed: 40, n: 3, best_of: 3 });
    expect(best.choices.map((c) => c.token_ids)).toEqual(j.choices.map((c) => c.token_ids));
  });

  test("best_of = 4, n = 2: the two candidates (seed + 0..3) with the highest cumulative logprob, per prompt", async () => {
    const body = { prompt: ["ab", "cd"], temperature: 1, seed: 60, max_tokens: 6 };
    const j = await complete({ ...body, n: 2, best_of: 4 });
    expect(j.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(j.choices[0]!.logprobs).toBeNull(); // computed for the ranking, not asked for
    let generated = 0;
    for (const [k, p] of ["ab", "cd"].entries()) {
      const cands = await Promise.all(
        [0, 1, 2, 3].map(async (i) => {
          const c = (await complete({ ...body, prompt: p, seed: 60 + i, logprobs: 0 })).choices[0]!;
          return { ids: c.token_ids, score: (c.logprobs as { token_logprobs: number[] }).token_logprobs.reduce((a, b) => a + b, 0) };
        }),
      );
      generated += cands.reduce((n, c) => n + c.ids.length, 0);
      cands.sort((a, b) => b.score - a.score);
      expect([j.choices[2 * k]!.token_ids, j.choices[2 * k + 1]!.token_ids]).toEqual([cands[0]!.ids, cands[1]!.ids]);
    }
    expect(j.usage.completion_tokens).toBe(generated); // every candidate counts, as OpenAI bills best_of
  });

  test("a list of prompts (strings or token arrays) gives one choice per prompt, in order; streams carry the index", async () => {
    const j = await complete({ prompt: ["ab", "cd"], temperature: 0 });
    expect(j.choices[0]!.token_ids).toEqual(await ids({ prompt: "ab", temperature: 0 }));
    expect(j.choices[1]!.token_ids).toEqual(await ids({ prompt: "cd", temperature: 0 }));
    const t = await complete({ prompt: [prompt, [A, A]], temperature: 0, n: 2 });
    expect(t.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(t.choices[3]!.token_ids).toEqual(await ids({ prompt: [A, A], temperature: 0 }));
    expect(t.usage.prompt_tokens).toBe(5);
    const res = await fetch(`http://${E.httpAddress}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: ["ab", "cd"], temperature: 0, max_tokens: 12, stream: true }),
    });
    const events = (await sseEvents(res)).filter((e): e is { choices: { index: number; text: string }[] } => typeof e !== "string");
    for (const i of [0, 1]) {
      expect(events.flatMap((e) => e.choices.filter((c) => c.index === i).map((c) => c.text)).join("")).toBe(j.choices[i]!.text);
    }
  });

  test("echo puts the prompt's text before the completion, in JSON and in a stream", async () => {
    const plain = (await complete({ prompt: "Hey", temperature: 0 })).choices[0]!.text;
    expect((await complete({ prompt: "Hey", temperature: 0, echo: true })).choices[0]!.text).toBe(`Hey${plain}`);
    const res = await fetch(`http://${E.httpAddress}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: "Hey", temperature: 0, max_tokens: 12, echo: true, stream: true }),
    });
    const events = (await sseEvents(res)).filter((e): e is { choices: { text: string }[] } => typeof e !== "string");
    expect(events.flatMap((e) => e.choices.map((c) => c.text)).join("")).toBe(`Hey${plain}`);
  });
});

describe("chat messages", () => {
  test("an assistant message with tool_calls and content null, and a tool message, are accepted and rendered", async () => {
    const messages = [
      { role: "user", content: "weather?" },
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] },
      { role: "tool", tool_call_id: "c1", content: "sunny" },
    ];
    const j = await complete({ messages, temperature: 0, max_tokens: 3 }, "/v1/chat/completions");
    const short = await complete({ messages: messages.slice(0, 1), temperature: 0, max_tokens: 3 }, "/v1/chat/completions");
    // The default template renders each turn's content (the tool result here); a model's template renders the calls too.
    expect(j.usage.prompt_tokens).toBeGreaterThan(short.usage.prompt_tokens + "sunny".length);
    expect((await refused({ messages: [{ role: "assistant", content: null }] }, "/v1/chat/completions")).message).toMatch(
      /content is required unless the message has tool_calls/,
    );
    expect((await refused({ messages: [{ role: "tool", content: "x" }] }, "/v1/chat/completions")).message).toMatch(/tool_call_id is required/);
  });
});

describe("every refused parameter is a 400 that names it", () => {
  const chat = (extra: Record<string, unknown>) => ({ messages: [{ role: "user", content: "hi" }], ...extra });
  const cases: [string, Record<string, unknown>, string, RegExp][] = [
    // This model's template shows no tool-call syntax: "auto" (the default with tools) needs --tool-call-parser.
    ["/v1/chat/completions", chat({ tools: [{ type: "function", function: { name: "f" } }] }), "tool_choice", /--tool-call-parser/],
    ["/v1/chat/completions", chat({ tool_choice: "required" }), "tool_choice", /tool_choice needs tools/],
    ["/v1/chat/completions", chat({ tool_choice: "auto" }), "tool_choice", /tool_choice needs tools/],
    ["/v1/chat/completions", chat({ response_format: { type: "json_schema" } }), "response_format", /json_schema/],
    ["/v1/chat/completions", chat({ response_format: { type: "xml" } }), "response_format", /"xml" is not supported/],
    ["/v1/chat/completions", chat({ functions: [] }), "functions", /legacy/],
    ["/v1/chat/completions", chat({ functions: [{ name: "f" }] }), "functions", /send tools and tool_choice/],
    ["/v1/chat/completions", chat({ parallel_tool_calls: "yes" }), "parallel_tool_calls", /boolean/],
    ["/v1/chat/completions", chat({ audio: { voice: "alloy" } }), "audio", /audio/],
    ["/v1/chat/completions", chat({ modalities: ["text", "audio"] }), "modalities", /text modality/],
    ["/v1/chat/completions", chat({ prediction: { type: "content", content: "x" } }), "prediction", /predicted/],
    ["/v1/chat/completions", chat({ reasoning_effort: "low" }), "reasoning_effort", /reason/],
    ["/v1/chat/completions", chat({ web_search_options: {} }), "web_search_options", /web search/],
    ["/v1/chat/completions", chat({ store: true }), "store", /nothing is stored/],
    ["/v1/chat/completions", chat({ service_tier: "flex" }), "service_tier", /service_tier/],
    ["/v1/chat/completions", chat({ echo: true }), "echo", /echo/],
    ["/v1/chat/completions", chat({ top_logprobs: 21, logprobs: true }), "top_logprobs", /\[0, 20\]/],
    ["/v1/completions", { prompt: "x", suffix: "y" }, "suffix", /suffix/],
    ["/v1/completions", { prompt: "x", best_of: 2, n: 3 }, "best_of", /best_of \(2\) must be ≥ n \(3\)/],
    ["/v1/completions", { prompt: "x", best_of: 3, stream: true }, "best_of", /cannot be streamed/],
    ["/v1/completions", { prompt: Array(8).fill("x"), best_of: 9 }, "best_of", /choices; at most/],
    ["/v1/completions", { prompt: "x", echo: true, logprobs: 1 }, "echo", /echo with logprobs/],
    ["/v1/completions", { prompt: "x", logprobs: 21 }, "logprobs", /\[0, 20\]/],
    ["/v1/completions", { prompt: "x", top_p: 0 }, "top_p", /top_p must be in \(0, 1\], got 0/],
    ["/v1/completions", { prompt: "x", top_p: 1.5 }, "top_p", /top_p/],
    ["/v1/completions", { prompt: "x", temperature: -0.1 }, "temperature", /temperature/],
    ["/v1/completions", { prompt: "x", presence_penalty: 2.5 }, "presence_penalty", /\[-2, 2\]/],
    ["/v1/completions", { prompt: "x", frequency_penalty: -3 }, "frequency_penalty", /\[-2, 2\]/],
    ["/v1/completions", { prompt: "x", repetition_penalty: 0 }, "repetition_penalty", /repetition_penalty/],
    // Its products must stay finite: 1e-300 divides a logit into +Infinity.
    ["/v1/completions", { prompt: "x", repetition_penalty: 1e-300 }, "repetition_penalty", /\[0\.01, 100\], got 1e-300/],
    ["/v1/completions", { prompt: "x", repetition_penalty: 0.0099 }, "repetition_penalty", /\[0\.01, 100\]/],
    ["/v1/completions", { prompt: "x", repetition_penalty: 100.5 }, "repetition_penalty", /\[0\.01, 100\]/],
    ["/v1/completions", { prompt: "x", temperature: 1e300 }, "temperature", /temperature/],
    ["/v1/completions", { prompt: "x", logit_bias: { "65": 101 } }, "logit_bias", /\[-100, 100\]/],
    ["/v1/completions", { prompt: "x", logit_bias: { "999": 1 } }, "logit_bias", /not a token id/],
    ["/v1/completions", { prompt: "x", top_k: -2 }, "top_k", /top_k/],
    ["/v1/completions", { prompt: "x", n: 0 }, "n", /\bn must be/],
    ["/v1/completions", { prompt: "x", n: LIMITS.n + 1 }, "n", /\bn must be/],
    ["/v1/completions", { prompt: Array(9).fill("x"), n: 8 }, "n", /choices; at most/],
    ["/v1/completions", { prompt: "x", min_tokens: 20, max_tokens: 5 }, "min_tokens", /min_tokens/],
    ["/v1/completions", { prompt: "x", max_tokens: 0 }, "max_tokens", /max_tokens/],
    ["/v1/completions", { prompt: "x", stop: "s".repeat(1 << 20) }, "stop", /characters; at most/],
    ["/v1/completions", { prompt: "x", stop_token_ids: Array(100_000).fill(1) }, "stop_token_ids", /at most/],
    ["/v1/completions", { prompt: "x", stream_options: { include_usage: true } }, "stream_options", /only allowed when stream/],
    ["/v1/completions", { prompt: "x", min_p: 0.1 }, "min_p", /min_p/],
    ["/v1/completions", { prompt: "x", use_beam_search: true }, "use_beam_search", /beam/],
    ["/v1/completions", { prompt: "x", guided_json: { type: "object", oneOf: [] } }, "guided_json", /"oneOf"/],
    ["/v1/completions", { prompt: "x", skip_special_tokens: false }, "skip_special_tokens", /skip_special_tokens/],
  ];
  test("each case", async () => {
    for (const [path, body, param, msg] of cases) {
      const e = await refused(body, path);
      expect({ param: e.param, msg: msg.test(e.message), message: e.message.slice(0, 200) }).toMatchObject({ param, msg: true });
    }
    expect(E.pool.used).toBe(0);
  });

  test("a chat request without max_tokens whose prompt fills the context is a 400 saying so", async () => {
    const e = await refused(chat({ messages: [{ role: "user", content: "y".repeat(400) }] }), "/v1/chat/completions");
    expect(e.message).toMatch(/fills the model's context of 300 tokens/);
  });

  test("accepted without effect: response_format text, tool_choice none, user, metadata; unknown fields are named in a header", async () => {
    const ok = {
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
      response_format: { type: "text" },
      tool_choice: "none",
      user: "u1",
      metadata: { a: "b" },
      store: false,
    };
    const res = await fetch(`http://${E.httpAddress}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ ...ok, frobnicate: 1 }) });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-tl-ignored-fields")).toBe("frobnicate");
    await res.json();
  });
});

describe("seeds", () => {
  test("a chosen seed is below 2^53 and, sent back as a JSON number, reproduces the tokens", async () => {
    for (let i = 0; i < 5; i++) {
      const res = await fetch(`http://${E.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt, max_tokens: 8, return_token_ids: true }),
      });
      const seed = BigInt(res.headers.get("x-tl-seed")!);
      expect(seed < 2n ** 53n).toBe(true);
      const first = ((await res.json()) as Body).choices[0]!.token_ids;
      expect(await ids({ prompt, max_tokens: 8, seed: Number(seed) })).toEqual(first);
    }
  });
});
