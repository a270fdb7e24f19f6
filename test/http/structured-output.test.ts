import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { loadModel, startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { schemaViolation } from "../support/schema-check.ts";
import { sseEvents } from "../support/nodes.ts";

// The embedded model writes verse-shaped nonsense: only the constraint can make these outputs parse.
let C: EngineNode;
/** The model on a thread of its own, which samples (and masks) planned-ahead decode steps itself. */
let W: EngineNode;
beforeAll(async () => {
  [C, W] = await Promise.all([
    startEngineNode({ role: "both", model: await loadModel({ threads: 1, modelThread: "main" }), blockTokens: 16, numBlocks: 64 }),
    startEngineNode({ role: "both", model: await loadModel({ threads: 2, modelThread: "worker" }), blockTokens: 16, numBlocks: 128 }),
  ]);
});
afterAll(async () => {
  await Promise.all([C?.shutdown(), W?.shutdown()]);
  W?.model.close?.();
});

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { type: "string", enum: ["saint", "king"] }, maxItems: 2 },
  },
  required: ["name", "age"],
  additionalProperties: false,
};

type Kind = "completion" | "chat";
async function post(kind: Kind, body: Record<string, unknown>, node = C): Promise<Response> {
  const path = kind === "chat" ? "/v1/chat/completions" : "/v1/completions";
  const prompt =
    kind === "chat"
      ? { messages: [{ role: "user", content: "And the LORD spake unto Moses, saying," }] }
      : { prompt: "And the LORD spake unto Moses, saying," };
  return fetch(`http://${node.httpAddress}${path}`, { method: "POST", body: JSON.stringify({ max_tokens: 150, ...prompt, ...body }) });
}

/** The choice's text (content), streamed or not, and its finish reason. */
async function text(kind: Kind, body: Record<string, unknown>, stream: boolean): Promise<{ text: string; finish: string }> {
  const res = await post(kind, { ...body, stream });
  expect(res.status).toBe(200);
  if (!stream) {
    const j = (await res.json()) as { choices: { text?: string; message?: { content: string }; finish_reason: string }[] };
    const c = j.choices[0]!;
    return { text: kind === "chat" ? c.message!.content : c.text!, finish: c.finish_reason };
  }
  const events = (await sseEvents(res)) as ({ choices: { text?: string; delta?: { content?: string }; finish_reason: string | null }[] } | string)[];
  expect(events.at(-1)).toBe("[DONE]");
  let out = "";
  let finish = "";
  for (const e of events) {
    if (typeof e === "string") continue;
    for (const c of e.choices) {
      out += (kind === "chat" ? c.delta?.content : c.text) ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text: out, finish };
}

const FORMS: { name: string; body: Record<string, unknown>; check: (t: string) => void }[] = [
  {
    name: "response_format json_schema",
    body: { response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON, strict: true } } },
    check: (t) => expect(schemaViolation(PERSON, JSON.parse(t))).toBeNull(),
  },
  {
    name: "response_format json_object",
    // Any object is allowed, and the model's keys run on: a bias towards '"' and '}' lets it close.
    body: { response_format: { type: "json_object" }, logit_bias: { "36": 15, "127": 15 } },
    check: (t) => {
      const v = JSON.parse(t);
      expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);
    },
  },
  { name: "structured_outputs.json", body: { structured_outputs: { json: PERSON } }, check: (t) => expect(schemaViolation(PERSON, JSON.parse(t))).toBeNull() },
  { name: "guided_json (as text)", body: { guided_json: JSON.stringify(PERSON) }, check: (t) => expect(schemaViolation(PERSON, JSON.parse(t))).toBeNull() },
  { name: "llama-server json_schema", body: { json_schema: PERSON }, check: (t) => expect(schemaViolation(PERSON, JSON.parse(t))).toBeNull() },
  {
    name: "structured_outputs.regex",
    body: { structured_outputs: { regex: "[A-Z][a-z]{2,8} [0-9]{1,3}:[0-9]{1,3}" } },
    check: (t) => expect(t).toMatch(/^[A-Z][a-z]{2,8} [0-9]{1,3}:[0-9]{1,3}$/),
  },
  { name: "guided_regex", body: { guided_regex: "(yea|nay), [a-z]{1,10}" }, check: (t) => expect(t).toMatch(/^(yea|nay), [a-z]{1,10}$/) },
  {
    name: "structured_outputs.choice",
    body: { structured_outputs: { choice: ["Genesis", "Exodus", "Leviticus"] } },
    check: (t) => expect(["Genesis", "Exodus", "Leviticus"]).toContain(t),
  },
  { name: "guided_choice", body: { guided_choice: ["verily", "amen"] }, check: (t) => expect(["verily", "amen"]).toContain(t) },
  {
    name: "llama-server grammar (GBNF)",
    body: { grammar: 'root ::= verse (", " verse){0,3}\nverse ::= [1-9] [0-9]? ":" [1-9] [0-9]?' },
    check: (t) => expect(t).toMatch(/^[1-9][0-9]?:[1-9][0-9]?(, [1-9][0-9]?:[1-9][0-9]?){0,3}$/),
  },
  { name: "guided_grammar", body: { guided_grammar: 'root ::= "(" [a-z ]{1,12} ")"' }, check: (t) => expect(t).toMatch(/^\([a-z ]{1,12}\)$/) },
  {
    name: "structured_outputs.grammar",
    body: { structured_outputs: { grammar: 'root ::= "thus saith " [a-z]{1,10}' } },
    check: (t) => expect(t).toMatch(/^thus saith [a-z]{1,10}$/),
  },
];

describe("every structured-output form constrains the embedded model's output", () => {
  for (const form of FORMS) {
    for (const kind of ["completion", "chat"] as const) {
      test(`${form.name}, ${kind}, streamed and not, seeded and greedy`, async () => {
        for (const [stream, sampling] of [
          [false, { temperature: 0.9, seed: 11 }],
          [true, { temperature: 0.9, seed: 12 }],
          [false, { temperature: 0 }],
        ] as const) {
          const { text: t, finish } = await text(kind, { ...form.body, ...sampling }, stream);
          expect(finish).toBe("stop");
          form.check(t);
        }
      });
    }
  }

  test("on a model thread, every form at once in one batch beside free text: each holds, the free text runs on", async () => {
    const runs = FORMS.map(async (form, i) => {
      const res = await post("completion", { ...form.body, temperature: 0.9, seed: 100 + i }, W);
      expect(res.status).toBe(200);
      const j = (await res.json()) as { choices: { text: string; finish_reason: string }[] };
      expect(j.choices[0]!.finish_reason).toBe("stop");
      form.check(j.choices[0]!.text);
    });
    const free = post("completion", { temperature: 0.9, seed: 5, max_tokens: 60, ignore_eos: true }, W).then(async (res) => {
      expect(((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(60);
    });
    await Promise.all([...runs, free]);
  });

  test("a dead end (the grammar must end, min_tokens holds EOS back) fails that request alone", async () => {
    for (const node of [C, W]) {
      const [dead, alive] = await Promise.all([
        post("completion", { structured_outputs: { choice: ["amen"] }, min_tokens: 20, max_tokens: 30 }, node),
        post("completion", { max_tokens: 30, ignore_eos: true, temperature: 0.9, seed: 3 }, node),
      ]);
      expect(dead.status).toBe(502);
      expect(((await dead.json()) as { error: { message: string } }).error.message).toMatch(/structured output: no token the grammar allows/);
      expect(alive.status).toBe(200);
      expect(((await alive.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(30);
      expect(node.engine.inFlight).toBe(0);
    }
  });

  test("the same request unconstrained is not JSON (the model alone does not make these pass)", async () => {
    const { text: t } = await text("completion", { temperature: 0.9, seed: 11, max_tokens: 40 }, false);
    expect(() => JSON.parse(t)).toThrow();
  });
});

describe("refusals come before any work", () => {
  test("a grammar that does not compile is a 400 naming why, before any prefill", async () => {
    const before = C.engine.stats.prefillTokens;
    for (const body of [{ grammar: "root ::= undefined_rule" }, { guided_regex: "[0-9" }, { structured_outputs: { grammar: 'root ::= "a' } }]) {
      const res = await post("completion", body);
      expect(res.status).toBe(400);
      const j = (await res.json()) as { error: { message: string } };
      expect(j.error.message).toMatch(/does not compile/);
      expect(j.error.message).not.toMatch(/\.cc:|Aborted/);
    }
    expect(C.engine.stats.prefillTokens).toBe(before);
  });

  test("a schema keyword that cannot be enforced is a 400 naming it", async () => {
    const res = await post("chat", {
      response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", not: { required: ["a"] } } } },
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain('"not"');
  });

  test("each spelling's bad values and combinations are refused by name", async () => {
    const cases: [Kind, Record<string, unknown>, string][] = [
      ["completion", { guided_decoding_backend: "outlines", guided_regex: "a" }, "guided_decoding_backend"],
      ["completion", { guided_whitespace_pattern: " ", guided_json: {} }, "guided_whitespace_pattern"],
      ["completion", { structured_outputs: { structural_tag: "x" } }, "structured_outputs"],
      ["completion", { structured_outputs: { regex: "a", choice: ["b"] } }, "structured_outputs"],
      ["completion", { guided_regex: "a", response_format: { type: "json_object" } }, "guided_regex"],
      ["completion", { response_format: { type: "json_schema", json_schema: { name: "x" } } }, "response_format"],
      ["completion", { guided_choice: [] }, "guided_choice"],
      ["completion", { json_schema: { type: "object" }, ignore_eos: true }, "ignore_eos"],
      ["completion", { tools: [] }, "tools"],
    ];
    for (const [kind, body, param] of cases) {
      const res = await post(kind, body);
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { param: string | null } }).error.param).toBe(param);
    }
  });
});
