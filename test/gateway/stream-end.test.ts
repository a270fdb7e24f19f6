import { expect, test } from "bun:test";
import { readTokenStream } from "../../src/gateway/token-stream.ts";
import { completionResponse, parseCompletion, TokenQueue } from "../../src/http/index.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";
import { sseEvents } from "../support/nodes.ts";

const tokenizer = new ByteTokenizer();

/** A decode engine that sends `chunks` and then ends its stream however `end` says. */
function fakeDecode(chunks: unknown[], end: "clean" | "done" | "error"): { url: string; stop: () => void } {
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch() {
      const body =
        chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("") +
        (end === "done" ? "data: [DONE]\n\n" : end === "error" ? `data: ${JSON.stringify({ error: { message: "boom" } })}\n\n` : "");
      return new Response(body, { headers: { "content-type": "text/event-stream" } });
    },
  });
  return { url: `http://127.0.0.1:${server.port}/v1/completions`, stop: () => server.stop(true) };
}

async function relay(end: "clean" | "done" | "error", n = 1) {
  const chunk = (index: number, t: number) => ({ choices: [{ index, text: "", token_ids: [t], finish_reason: null }] });
  const d = fakeDecode([chunk(0, 72), chunk(n - 1, 73), chunk(0, 74)], end);
  try {
    const params = parseCompletion("completion", { prompt: "x", max_tokens: 8, stream: true, n }, { tokenizer, maxModelLen: 64 });
    const qs = Array.from({ length: n }, () => new TokenQueue());
    await readTokenStream(d.url, {}, {}, qs, new AbortController().signal, () => {});
    const res = await completionResponse(qs, { id: "t", model: "fake", tokenizer, params, onStop: () => {}, onAbort: () => {} });
    return (await sseEvents(res)) as ({ error?: { message: string }; choices?: { text: string; finish_reason: string | null }[] } | string)[];
  } finally {
    d.stop();
  }
}

test("a decode stream that ends cleanly without [DONE] or an error event: the client's last event is an error, never a finish", async () => {
  for (const n of [1, 2]) {
    const events = await relay("clean", n);
    const last = events.at(-1) as { error?: { message: string } };
    expect(last.error?.message).toMatch(/ended without \[DONE\]/);
    expect(events.some((e) => typeof e !== "string" && e.choices?.some((c) => c.finish_reason !== null))).toBe(false);
    expect(events).not.toContain("[DONE]");
  }
  const broken = await relay("error");
  expect((broken.at(-1) as { error?: { message: string } }).error?.message).toMatch(/boom/);
  const ok = await relay("done");
  expect(ok.at(-1)).toBe("[DONE]");
  expect((ok.at(-2) as { choices: { finish_reason: string }[] }).choices[0]!.finish_reason).toBe("stop");
});

test("a resume refused with 412 (the engine cannot continue its structured output) routes again; other refusals do not", async () => {
  for (const [status, want] of [
    [412, "failed"],
    [409, "refused"],
    [400, "refused"],
  ] as const) {
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json({ error: { message: "no" } }, { status }) });
    try {
      const q = new TokenQueue();
      const outcome = await readTokenStream(`http://127.0.0.1:${server.port}/v1/completions`, {}, {}, [q], new AbortController().signal, () => {});
      expect([status, outcome]).toEqual([status, want]);
      expect(q.end.reason).toBe("error");
    } finally {
      server.stop(true);
    }
  }
});

test("an engine's own 400 (a grammar that does not compile on a colocated engine) reaches the client as a 400 with its words, not a 502 with the engine's address", async () => {
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: () => Response.json({ error: { message: 'structured output: the grammar does not compile: Rule "x" is not defined' } }, { status: 400 }),
  });
  try {
    for (const stream of [false, true]) {
      const params = parseCompletion("completion", { prompt: "x", max_tokens: 8, stream }, { tokenizer, maxModelLen: 64 });
      const q = new TokenQueue();
      const url = `http://127.0.0.1:${server.port}/v1/completions`;
      expect(await readTokenStream(url, {}, {}, [q], new AbortController().signal, () => {})).toBe("refused");
      const res = await completionResponse([q], { id: "t", model: "fake", tokenizer, params, onStop: () => {}, onAbort: () => {} });
      const error = stream
        ? ((await sseEvents(res)).at(-1) as { error: { message: string; code: number } }).error
        : (expect(res.status).toBe(400), ((await res.json()) as { error: { message: string; code: number } }).error);
      expect(error.code).toBe(400);
      expect(error.message).toMatch(/does not compile/);
      expect(error.message).not.toContain(String(server.port));
    }
  } finally {
    server.stop(true);
  }
});
