import { afterAll, beforeAll, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { fakeServedModel, sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

// Conditional disaggregation: fewer than 24 uncached prompt tokens on the chosen decode
// engine, and it prefills them itself; no Prefill on P, no transfer.
let c: TestCluster;
let solo: EngineNode;
beforeAll(async () => {
  [c, solo] = await Promise.all([
    startTestCluster({ prefill: 1, decode: 2, gateway: { disaggMinUncachedTokens: 24 } }),
    startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 256, maxModelLen: 512 }),
  ]);
});
afterAll(async () => {
  await Promise.all([c?.stop(), solo?.shutdown()]);
});

const post = (base: string, body: unknown) => fetch(`http://${base}/v1/completions`, { method: "POST", body: JSON.stringify(body) });
const text = async (r: Response) => ((await r.json()) as { choices: { text: string }[] }).choices[0]!.text;

test("a short prompt is prefilled on the decode engine itself, says so, and equals a colocated engine", async () => {
  const P = c.prefill[0]!;
  const before = P.engine.stats.prefillTokens;
  for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 5 }]) {
    const body = { prompt: "short one", max_tokens: 8, ...sampling };
    const res = await post(c.gateway.httpAddress, body);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-tl-served")).toBe("decode-local");
    expect(res.headers.get("x-tl-decode-worker")).toMatch(/^decode-/);
    expect(res.headers.get("x-tl-blocks-sent")).toBe("0");
    expect(await text(res)).toBe(await text(await post(solo.httpAddress, body)));
  }
  const s = await post(c.gateway.httpAddress, { prompt: "short one", max_tokens: 4, temperature: 0, stream: true });
  expect(s.headers.get("x-tl-served")).toBe("decode-local");
  expect((await sseEvents(s)).at(-1)).toBe("[DONE]");
  expect(P.engine.stats.prefillTokens).toBe(before);
  const metrics = await (await fetch(`http://${c.gateway.httpAddress}/metrics`)).text();
  expect(metrics).toMatch(/tl_requests_total\{[^}]*served="decode-local"[^}]*outcome="ok"[^}]*\} 3/);
  expect(metrics).toMatch(/time_to_first_token_seconds_count\{[^}]*served="decode-local"[^}]*\} 3/);
});

test("a long prompt is disaggregated; a follow-up D mostly holds is prefilled there, where its prefix is", async () => {
  const system = "You are a helpful assistant. ".repeat(3);
  const long = await post(c.gateway.httpAddress, { prompt: `${system}First?`, max_tokens: 3, temperature: 0 });
  expect(long.headers.get("x-tl-served")).toBe("disaggregated");
  const d = long.headers.get("x-tl-decode-worker");
  await long.text();
  // The follow-up is as long, but only its tail (< 24 tokens) is uncached on d.
  const body = { prompt: `${system}Second one?`, max_tokens: 5, temperature: 0 };
  const follow = await post(c.gateway.httpAddress, body);
  expect([follow.headers.get("x-tl-served"), follow.headers.get("x-tl-decode-worker")]).toEqual(["decode-local", d]);
  expect(await text(follow)).toBe(await text(await post(solo.httpAddress, body)));
});
