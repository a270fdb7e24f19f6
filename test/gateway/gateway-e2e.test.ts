import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { promptHashes } from "../../src/codec/index.ts";
import { blockPayloadBytes } from "../../src/codec/index.ts";
import { startEngineNode } from "../../src/cli/engine-node.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel, sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

let c: TestCluster;
beforeAll(async () => {
  c = await startTestCluster({ prefill: 1, decode: 2 });
});
afterAll(async () => {
  await c?.stop();
});

const post = (path: string, body: unknown, signal?: AbortSignal) =>
  fetch(`http://${c.gateway.httpAddress}${path}`, { method: "POST", body: JSON.stringify(body), signal });

function atBaseline() {
  for (const n of c.all()) {
    expect({ worker: n.workerId, used: n.pool.used }).toEqual({ worker: n.workerId, used: 0 });
    if (n.receiver) expect({ worker: n.workerId, pending: n.receiver.pending() }).toEqual({ worker: n.workerId, pending: 0 });
  }
}

async function waitBaseline(timeoutMs = 20_000) {
  const end = Date.now() + timeoutMs;
  while (c.all().some((n) => n.pool.used > 0 || (n.receiver?.pending() ?? 0) > 0) && Date.now() < end) await Bun.sleep(10);
  atBaseline();
}

describe("gateway end to end (1 prefill + 2 decode)", () => {
  test("registration: ListWorkers-side registry lists all three with their roles and addresses", () => {
    const live = c.gateway.registry.live();
    expect(live.map((w) => w.status.workerId).sort()).toEqual(["decode-0", "decode-1", "prefill-0"]);
    for (const w of live) {
      expect(w.status.kvFormat).toBe(1);
      expect(w.status.kvAddress === "").toBe(w.status.workerId.startsWith("prefill"));
    }
  });

  test("completions stream through P and D and equal a colocated engine", async () => {
    const solo = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 64 });
    try {
      for (const sampling of [{ temperature: 0 }, { temperature: 0.8, seed: 42 }]) {
        const body = { prompt: "The quick brown fox", max_tokens: 10, ...sampling };
        const want = (await (await fetch(`http://${solo.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(body) })).json()) as {
          choices: { text: string; token_ids: number[] }[];
        };
        expect(want.choices[0]!.token_ids.length).toBe(10);
        const res = await post("/v1/completions", body);
        expect(res.status).toBe(200);
        expect(res.headers.get("x-tl-served")).toBe("disaggregated");
        const got = (await res.json()) as { choices: { text: string; token_ids: number[] }[]; usage: { completion_tokens: number } };
        expect(got.choices[0]!.text).toBe(want.choices[0]!.text);
        expect(got.choices[0]!.token_ids).toEqual(want.choices[0]!.token_ids);
        expect(got.usage.completion_tokens).toBe(10);
        const s = await post("/v1/completions", { ...body, stream: true });
        const events = (await sseEvents(s)) as ({ choices: { text: string; token_ids?: number[] }[] } | string)[];
        expect(events.at(-1)).toBe("[DONE]");
        // The final chunk carries the generated ids, P's first token included.
        expect((events.at(-2) as { choices: { token_ids?: number[] }[] }).choices[0]!.token_ids).toEqual(want.choices[0]!.token_ids);
        expect(events.flatMap((e) => (typeof e === "string" ? [] : e.choices.map((x) => x.text))).join("")).toBe(want.choices[0]!.text);
      }
      const chat = await post("/v1/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 5, temperature: 0 });
      expect(chat.status).toBe(200);
      const cj = (await chat.json()) as { object: string; choices: { message: { role: string } }[] };
      expect([cj.object, cj.choices[0]!.message.role]).toEqual(["chat.completion", "assistant"]);
    } finally {
      await solo.shutdown();
    }
    await waitBaseline();
  });

  test("a second request sharing a long system prompt goes where it is cached and moves only the missing blocks plus the tail", async () => {
    const system = "You are a helpful assistant. ".repeat(4); // 116 bytes: 29 blocks of 4 with BOS... see below
    const first = await post("/v1/completions", { prompt: system + "Question one?", max_tokens: 2, temperature: 0 });
    expect(first.status).toBe(200);
    const d1 = first.headers.get("x-tl-decode-worker")!;
    await first.text();
    const second = await post("/v1/completions", { prompt: system + "Another question, longer?", max_tokens: 2, temperature: 0 });
    expect(second.status).toBe(200);
    await second.text();
    expect(second.headers.get("x-tl-decode-worker")).toBe(d1);
    // Tokens: BOS + UTF-8 bytes. Shared full blocks are deduped; the rest plus the tail move.
    const B = 4;
    const t1 = [256, ...new TextEncoder().encode(system + "Question one?")];
    const t2 = [256, ...new TextEncoder().encode(system + "Another question, longer?")];
    const h1 = promptHashes(t1, B);
    const h2 = promptHashes(t2, B);
    let shared = 0;
    while (shared < h2.length && h1[shared] === h2[shared]) shared++;
    const full = h2.length;
    const tail = t2.length % B === 0 ? 0 : 1;
    expect(Number(second.headers.get("x-tl-blocks-deduped"))).toBe(shared);
    expect(Number(second.headers.get("x-tl-blocks-sent"))).toBe(full - shared + tail);
    const P = blockPayloadBytes({ blockTokens: B, nLayers: 2, nKvHeads: 2, headDim: 4 });
    expect(Number(second.headers.get("x-tl-payload-bytes"))).toBe((full - shared + tail) * (28 + 12 + P + 4));
    expect(shared).toBeGreaterThan(20);
    await waitBaseline();
  });

  test("a client abort after Prefill leaves every pool at baseline", async () => {
    for (const d of c.decode) (d.model.runner as FakeRunner).slowMs = 3;
    try {
      for (const abortAfter of [0, 1, 5]) {
        const ac = new AbortController();
        const res = await post("/v1/completions", { prompt: "abort me please", max_tokens: 200, temperature: 0, stream: true }, ac.signal);
        expect(res.status).toBe(200);
        const reader = res.body!.getReader();
        for (let i = 0; i < abortAfter; i++) await reader.read();
        ac.abort();
        await reader.cancel().catch(() => {});
        await waitBaseline();
      }
    } finally {
      for (const d of c.decode) (d.model.runner as FakeRunner).slowMs = 0;
    }
  });

  test("metrics count how requests were served", async () => {
    const res = await fetch(`http://${c.gateway.httpAddress}/metrics`);
    const text = await res.text();
    expect(text).toMatch(/tl_requests_total\{served="disaggregated",outcome="ok"\} \d+/);
    expect(text).toMatch(/tl_kv_blocks_deduped_total [1-9]\d*/);
    expect(text).toMatch(/tl_registry_workers\{role="decode"\} 2/);
  });
});

describe("gateway failures", () => {
  test("killing a decode engine mid-stream fails its streams with an error event and routes new requests to the other", async () => {
    const k = await startTestCluster({ prefill: 1, decode: 2 });
    try {
      for (const d of k.decode) (d.model.runner as FakeRunner).slowMs = 2;
      const streams = await Promise.all(
        [0, 1, 2, 3].map((i) =>
          fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
            method: "POST",
            body: JSON.stringify({ prompt: `stream ${i} ${"x".repeat(i * 9)}`, max_tokens: 300, temperature: 0, stream: true }),
          }),
        ),
      );
      const victim = k.decode[0]!;
      const onVictim = streams.filter((s) => s.headers.get("x-tl-decode-worker") === victim.workerId);
      expect(onVictim.length).toBeGreaterThan(0);
      await Bun.sleep(50);
      await victim.shutdown(0);
      for (const s of streams) {
        const events = await sseEvents(s);
        const last = events.at(-1);
        if (s.headers.get("x-tl-decode-worker") === victim.workerId) {
          expect(last).not.toBe("[DONE]");
          expect((last as { error?: { message: string } }).error?.message).toMatch(/generation failed/);
        } else {
          expect(last).toBe("[DONE]");
        }
      }
      for (const d of k.decode) (d.model.runner as FakeRunner).slowMs = 0;
      // New requests go to the survivor, before and after the registry evicts the dead one.
      for (let i = 0; i < 3; i++) {
        const r = await fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
          method: "POST",
          body: JSON.stringify({ prompt: `after ${i}`, max_tokens: 3, temperature: 0 }),
        });
        expect(r.status).toBe(200);
        expect(r.headers.get("x-tl-decode-worker")).toBe(k.decode[1]!.workerId);
        await r.text();
      }
      await k.waitForWorkers(2, 20_000);
      expect(
        k.gateway.registry
          .live()
          .map((w) => w.status.workerId)
          .sort(),
      ).toEqual(["decode-1", "prefill-0"]);
    } finally {
      await k.stop();
    }
  });

  test("a worker whose beats stop is evicted after 3 missed intervals, not before", async () => {
    const k = await startTestCluster({ prefill: 1, decode: 1, intervalMs: 100 });
    try {
      const quiet = k.decode[0]!;
      await quiet.heartbeat!.stop();
      const stoppedAt = Date.now();
      await Bun.sleep(150); // 1.5 intervals: still listed
      expect(k.gateway.registry.live().map((w) => w.status.workerId)).toContain(quiet.workerId);
      await k.waitForWorkers(1, 20_000);
      const gone = Date.now() - stoppedAt;
      expect(gone).toBeGreaterThanOrEqual(200); // ≥ 3 intervals after the last beat, which came up to 1 interval before the stop
      expect(k.gateway.registry.live().map((w) => w.status.workerId)).toEqual(["prefill-0"]);
    } finally {
      await k.stop();
    }
  });

  test("a draining gateway refuses new requests and lets in-flight streams finish", async () => {
    const k = await startTestCluster({ prefill: 1, decode: 1 });
    try {
      (k.decode[0]!.model.runner as FakeRunner).slowMs = 2;
      const streaming = fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "keep going", max_tokens: 80, temperature: 0, stream: true }),
      });
      const res = await streaming;
      const drained = k.gateway.drain(10_000);
      const late = await fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "too late", max_tokens: 2 }),
      });
      expect(late.status).toBe(503);
      expect(late.headers.get("retry-after")).toBe("1");
      const events = await sseEvents(res);
      expect(events.at(-1)).toBe("[DONE]");
      expect(await drained).toBe(0);
    } finally {
      await k.stop();
    }
  });

  test("without a pair the gateway falls back to a both engine, and with nothing answers 503", async () => {
    const k = await startTestCluster({ both: 1 });
    try {
      const r = await fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "hello", max_tokens: 4, temperature: 0 }),
      });
      expect(r.status).toBe(200);
      expect(r.headers.get("x-tl-served")).toBe("colocated-fallback");
      await r.text();
      await k.both[0]!.shutdown();
      await k.waitForWorkers(0, 20_000);
      const none = await fetch(`http://${k.gateway.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: "hello", max_tokens: 4 }) });
      expect(none.status).toBe(503);
      expect(none.headers.get("retry-after")).not.toBeNull();
    } finally {
      await k.stop();
    }
  });

  test("bad requests are 400 in OpenAI's error shape", async () => {
    for (const body of [
      { prompt: "x", max_tokens: 0 },
      { prompt: "", max_tokens: 2 },
      { prompt: "x", temperature: -1 },
      { prompt: "x", max_tokens: 10_000 },
    ]) {
      const r = await post("/v1/completions", body);
      expect(r.status).toBe(400);
      const j = (await r.json()) as { error: { message: string; type: string } };
      expect(j.error.type).toBe("invalid_request_error");
    }
    const r = await fetch(`http://${c.gateway.httpAddress}/v1/completions`, { method: "POST", body: "{not json" });
    expect(r.status).toBe(400);
  });
});
