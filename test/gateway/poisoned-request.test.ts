// One request's numbers fail that request only, through the gateway: a value judged up front is a
// 400 naming it before any work (it was a 429 from the prefill engine, whose whole step it failed),
// and the streams beside it get exactly the tokens they get without it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

let C: TestCluster;
beforeAll(async () => {
  C = await startTestCluster({ prefill: 1, decode: 1, gateway: { disaggMinUncachedTokens: 0 } });
});
afterAll(() => C?.stop());

const post = (body: Record<string, unknown>) =>
  fetch(`http://${C.gateway.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });

const streams = Array.from({ length: 6 }, (_, i) => ({ prompt: `stream ${i} says`, max_tokens: 40, temperature: 0.8, seed: 100 + i, stream: true }));

/** Every stream's token ids, started together with `extra` (which must not disturb them). */
async function runStreams(extra: Record<string, unknown>[]): Promise<{ ids: number[][]; extra: { status: number; body: string }[] }> {
  const started = streams.map((b) => post({ ...b, return_token_ids: true }));
  const others = extra.map(async (b) => {
    const r = await post(b);
    return { status: r.status, body: await r.text() };
  });
  const ids = await Promise.all(
    started.map(async (p) => {
      const res = await p;
      expect(res.status).toBe(200);
      const events = (await sseEvents(res)) as ({ choices?: { token_ids?: number[]; finish_reason?: string | null }[]; error?: unknown } | string)[];
      expect(events.some((e) => typeof e === "object" && e.error)).toBe(false);
      return events.flatMap((e) => (typeof e === "object" ? (e.choices ?? []).flatMap((c) => c.token_ids ?? []) : []));
    }),
  );
  return { ids, extra: await Promise.all(others) };
}

describe("a poisoned request through the gateway", () => {
  test("repetition_penalty 1e-300: 400 naming it, before any work", async () => {
    const before = C.all().map((n) => n.engine.stats.steps);
    const res = await post({ prompt: [0], max_tokens: 5, repetition_penalty: 1e-300, temperature: 0.8, seed: 1 });
    const j = (await res.json()) as { error: { param: string; message: string } };
    expect([res.status, j.error.param]).toEqual([400, "repetition_penalty"]);
    expect(j.error.message).toContain("[0.01, 100]");
    expect(C.all().map((n) => n.engine.stats.steps)).toEqual(before);
  });

  test("sent amid other streams: 400 for it, the others' tokens exactly as without it", async () => {
    const want = await runStreams([]);
    const poisoned = { prompt: [0], max_tokens: 5, repetition_penalty: 1e-300, temperature: 0.8, seed: 1 };
    const got = await runStreams([poisoned, { ...poisoned, stream: true }, { ...poisoned, temperature: 0 }]);
    expect(got.ids).toEqual(want.ids);
    expect(got.extra.map((e) => e.status)).toEqual([400, 400, 400]);
    for (let i = 0; i < 500 && C.all().some((n) => n.engine.pool.used > 0); i++) await Bun.sleep(5);
    expect(C.all().map((n) => n.engine.pool.used)).toEqual([0, 0]);
  });
});
