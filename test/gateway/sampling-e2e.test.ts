import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { promptHashes } from "../../src/codec/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel, sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

// The same request through the gateway over P and D, and on one colocated engine, must
// give the same choices: tokens, text, finish reasons and logprobs (the first token's
// computed on P and carried in the handle, the rest on D).
let c: TestCluster;
let solo: EngineNode;
beforeAll(async () => {
  [c, solo] = await Promise.all([
    startTestCluster({ prefill: 1, decode: 1 }),
    startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 256, maxModelLen: 512 }),
  ]);
});
afterAll(async () => {
  await Promise.all([c?.stop(), solo?.shutdown()]);
});

type Choice = { index: number; text?: string; message?: { content: string }; token_ids: number[]; logprobs: unknown; finish_reason: string };

async function choices(base: string, path: string, body: Record<string, unknown>, stream: boolean): Promise<{ served: string | null; choices: Choice[] }> {
  const res = await fetch(`http://${base}${path}`, { method: "POST", body: JSON.stringify({ ...body, stream, return_token_ids: true }) });
  expect(res.status).toBe(200);
  const served = res.headers.get("x-tl-served");
  if (!stream)
    return {
      served,
      choices: ((await res.json()) as { choices: Choice[] }).choices.map(({ index, text, message, token_ids, logprobs, finish_reason }) => ({
        index,
        text,
        message,
        token_ids,
        logprobs,
        finish_reason,
      })),
    };
  const events = await sseEvents(res);
  expect(events.at(-1)).toBe("[DONE]");
  // Reassemble each choice from its chunks, so the stream compares as a whole.
  const by = new Map<number, { text: string; ids: number[]; lp: unknown[]; finish: string | null }>();
  for (const e of events) {
    if (typeof e === "string") continue;
    for (const ch of (
      e as {
        choices: {
          index: number;
          text?: string;
          delta?: { content?: string };
          token_ids?: number[];
          logprobs: Record<string, unknown[]> | null;
          finish_reason: string | null;
        }[];
      }
    ).choices) {
      const acc = by.get(ch.index) ?? { text: "", ids: [], lp: [], finish: null };
      acc.text += ch.text ?? ch.delta?.content ?? "";
      acc.ids.push(...(ch.token_ids ?? []));
      if (ch.logprobs) acc.lp.push(ch.logprobs);
      acc.finish ??= ch.finish_reason;
      by.set(ch.index, acc);
    }
  }
  return {
    served,
    choices: [...by.entries()]
      .sort((a, b) => a[0] - b[0])
      .map(([index, a]) => ({ index, text: a.text, token_ids: a.ids, logprobs: a.lp, finish_reason: a.finish! })),
  };
}

const A = 65;
const cases: [string, string, Record<string, unknown>][] = [
  [
    "greedy with penalties and a bias",
    "/v1/completions",
    { prompt: "The quick brown fox", max_tokens: 14, temperature: 0, presence_penalty: 1.2, frequency_penalty: 0.7, logit_bias: { [A]: 3.5 } },
  ],
  [
    "seeded with repetition_penalty and logprobs",
    "/v1/completions",
    { prompt: "jumps over the lazy dog", max_tokens: 14, temperature: 0.9, seed: 77, repetition_penalty: 1.7, logprobs: 3 },
  ],
  [
    "seeded, top_k/top_p, every processor, min_tokens",
    "/v1/completions",
    {
      prompt: [72, 101, 108, 108, 111],
      max_tokens: 16,
      temperature: 1.2,
      top_k: 40,
      top_p: 0.9,
      seed: 123456789,
      presence_penalty: -0.5,
      frequency_penalty: 1.9,
      repetition_penalty: 0.8,
      logit_bias: { [A]: 2, 66: -100, 257: 3 },
      min_tokens: 6,
      logprobs: 2,
    },
  ],
  [
    "chat with logprobs and a penalty",
    "/v1/chat/completions",
    { messages: [{ role: "user", content: "tell me" }], max_tokens: 10, temperature: 0.7, seed: 9, frequency_penalty: 1, logprobs: true, top_logprobs: 4 },
  ],
  [
    "chat with n = 2, logprobs and min_tokens",
    "/v1/chat/completions",
    { messages: [{ role: "user", content: "two ways" }], n: 2, max_tokens: 8, temperature: 1, seed: 13, logprobs: true, top_logprobs: 1, min_tokens: 3 },
  ],
  [
    "n = 3 and a list of prompts",
    "/v1/completions",
    { prompt: ["ab", [70, 71, 72, 73, 74]], n: 3, max_tokens: 8, temperature: 1, seed: 5, logprobs: 1, frequency_penalty: 0.5 },
  ],
  [
    "echo with n = 2 and include_stop_str_in_output",
    "/v1/completions",
    { prompt: "Echo me", echo: true, n: 2, max_tokens: 10, temperature: 0.9, seed: 4, include_stop_str_in_output: true, stop: ["e"] },
  ],
  ["best_of = 3, n = 2", "/v1/completions", { prompt: "best of", n: 2, best_of: 3, max_tokens: 8, temperature: 1, seed: 31, presence_penalty: 0.5 }],
  [
    "the first token ends the request (EOS forced) and min_tokens: 1 lifts it",
    "/v1/completions",
    { prompt: "stop", max_tokens: 5, temperature: 0, logit_bias: { 257: 100 } },
  ],
  ["ignore_eos", "/v1/completions", { prompt: "stop", max_tokens: 5, temperature: 0.5, seed: 1, logit_bias: { 257: 100 }, ignore_eos: true, logprobs: 1 }],
];

describe("disaggregated equals colocated with the sampling parameters", () => {
  for (const [name, path, body] of cases) {
    test(name, async () => {
      for (const stream of body.best_of ? [false] : [false, true]) {
        const want = await choices(solo.httpAddress, path, body, stream);
        const got = await choices(c.gateway.httpAddress, path, body, stream);
        expect(got.served).toBe("disaggregated");
        expect(got.choices).toEqual(want.choices);
        expect(want.choices.length).toBeGreaterThan(0);
      }
    });
  }

  test("n = 3 is one prefill on P and one resume on D, whose choices share the pushed blocks", async () => {
    const P = c.prefill[0]!;
    const D = c.decode[0]!;
    (D.model.runner as FakeRunner).slowMs = 1;
    try {
      for (const prompt of [
        [9, 8, 7, 6, 5, 4, 3, 2],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
      ]) {
        // max_tokens 200 at 1 ms a step keeps D busy long enough to look at its pool mid-stream.
        const body = { prompt, n: 3, max_tokens: 200, temperature: 1, seed: 11, ignore_eos: true };
        const before = P.engine.stats.prefillTokens;
        const res = await fetch(`http://${c.gateway.httpAddress}/v1/completions`, {
          method: "POST",
          body: JSON.stringify({ ...body, stream: true, return_token_ids: true }),
        });
        const reader = res.body!.getReader();
        await reader.read();
        const end = Date.now() + 3000;
        while (D.engine.inFlight < 3 && Date.now() < end) await Bun.sleep(1);
        expect(D.engine.inFlight).toBe(3);
        // Every choice holds the prompt's first pushed block: one block, three references.
        expect(D.pool.refCount(D.pool.lookup(promptHashes(prompt, 4)[0]!))).toBe(3);
        while (!(await reader.read()).done);
        expect(P.engine.stats.prefillTokens - before).toBe(prompt.length);
        const got = await choices(c.gateway.httpAddress, "/v1/completions", body, false);
        expect(got.choices).toEqual((await choices(solo.httpAddress, "/v1/completions", body, false)).choices);
      }
    } finally {
      (D.model.runner as FakeRunner).slowMs = 0;
    }
  });

  test("n = 4 where P's first token ends some choices: D resumes only the others, each with its own seed", async () => {
    const body = (seed: number) => ({ prompt: "mixed", n: 4, max_tokens: 6, temperature: 1, seed, logit_bias: { 257: 3.2 }, logprobs: 1 });
    let seed = 0;
    let want: Awaited<ReturnType<typeof choices>> | null = null;
    for (; seed < 50; seed++) {
      want = await choices(solo.httpAddress, "/v1/completions", body(seed), false);
      // Choice 0 ends on P and a later one goes on: the open choices are not 0..k-1.
      const ended = want.choices.map((x) => x.token_ids.length === 1 && x.token_ids[0] === 257);
      if (ended[0] && ended.includes(false)) break;
    }
    expect(seed).toBeLessThan(50);
    for (const stream of [false, true]) {
      expect((await choices(c.gateway.httpAddress, "/v1/completions", body(seed), stream)).choices).toEqual(
        (await choices(solo.httpAddress, "/v1/completions", body(seed), stream)).choices,
      );
    }
  });

  test("a stop string ends one of n choices and leaves the others", async () => {
    const body = { prompt: "stop strings", n: 3, max_tokens: 30, temperature: 1, seed: 21 };
    const plain = await choices(solo.httpAddress, "/v1/completions", body, false);
    const stop = plain.choices[1]!.text!.slice(3, 5);
    for (const stream of [false, true]) {
      const want = await choices(solo.httpAddress, "/v1/completions", { ...body, stop }, stream);
      expect(want.choices[1]!.finish_reason).toBe("stop");
      expect((await choices(c.gateway.httpAddress, "/v1/completions", { ...body, stop }, stream)).choices.map((x) => [x.text, x.finish_reason])).toEqual(
        want.choices.map((x) => [x.text, x.finish_reason]),
      );
    }
  });

  test("min_tokens holds stop strings back across the hand-off too", async () => {
    const base = { prompt: "min and stop", max_tokens: 12, temperature: 0.6, seed: 8 };
    const text = (await choices(solo.httpAddress, "/v1/completions", base, false)).choices[0]!.text!;
    for (const stop of [text.slice(0, 1), text.slice(1, 2)]) {
      for (const stream of [false, true]) {
        const body = { ...base, stop, min_tokens: 5 };
        expect((await choices(c.gateway.httpAddress, "/v1/completions", body, stream)).choices).toEqual(
          (await choices(solo.httpAddress, "/v1/completions", body, stream)).choices,
        );
      }
    }
  });

  test("min_tokens holds EOS back across the hand-off", async () => {
    const body = { prompt: "stop", max_tokens: 5, temperature: 0, logit_bias: { 257: 100 }, min_tokens: 3 };
    const got = await choices(c.gateway.httpAddress, "/v1/completions", body, false);
    expect(got.choices[0]!.token_ids.length).toBe(4);
    expect(got.choices[0]!.token_ids.at(-1)).toBe(257);
    expect(got.choices).toEqual((await choices(solo.httpAddress, "/v1/completions", body, false)).choices);
  });

  test("pools and handles are back at baseline", async () => {
    const end = Date.now() + 3000;
    while (c.all().some((n) => n.pool.used > 0 || (n.receiver?.pending() ?? 0) > 0) && Date.now() < end) await Bun.sleep(10);
    for (const n of [...c.all(), solo])
      expect({ w: n.workerId, used: n.pool.used, pending: n.receiver?.pending() ?? 0 }).toEqual({ w: n.workerId, used: 0, pending: 0 });
  });
});
