import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Role, WorkerStatusSchema } from "../../src/gen/tl/control/v1/control_pb.ts";
import { sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

// Engines that freeze: a socket that accepts and never answers (as a SIGSTOPped
// process does), and a stream that stops between tokens. The fake engines beat on
// time, so only the gateway's deadlines can find them out.
let c: TestCluster;
let frozen: Bun.TCPSocketListener<undefined>;
const beats: ReturnType<typeof setInterval>[] = [];
beforeAll(async () => {
  c = await startTestCluster({
    prefill: 1,
    decode: 1,
    // Deadlines well above what a loaded machine shows the healthy engines, so only the fakes miss them.
    gateway: { prefillTimeoutMs: 2000, firstByteTimeoutMs: 1500, interTokenTimeoutMs: 1000, suspectCooldownMs: 60_000 },
  });
  frozen = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {}, open() {} } });
});
afterAll(async () => {
  for (const b of beats) clearInterval(b);
  frozen?.stop(true);
  await c?.stop();
});

const frozenAddr = () => `127.0.0.1:${frozen.port}`;

/** A decode engine that beats like a healthy, emptier one (so the picker tries it first) at the given addresses. */
function fakeDecode(workerId: string, addrs: { httpAddress: string; kvAddress: string }) {
  const status = create(WorkerStatusSchema, {
    workerId,
    role: Role.DECODE,
    kvFormat: 1,
    seq: 1n,
    blockTokens: 4,
    freeBlocks: 100_000,
    totalBlocks: 100_000,
    model: "fake",
    grpcAddress: frozenAddr(),
    ...addrs,
  });
  c.gateway.registry.beat(status);
  beats.push(setInterval(() => c.gateway.registry.beat(status), 30));
}

const post = (body: unknown) => fetch(`http://${c.gateway.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(body) });

async function waitDecodeIdle(timeoutMs = 20_000) {
  const D = c.decode[0]!;
  const end = Date.now() + timeoutMs;
  while ((D.pool.used > 0 || (D.receiver?.pending() ?? 0) > 0) && Date.now() < end) await Bun.sleep(10);
  expect({ used: D.pool.used, pending: D.receiver?.pending() }).toEqual({ used: 0, pending: 0 });
}

describe("deadlines route around a frozen engine", () => {
  test("a decode engine whose KV port never answers: Prefill misses its deadline, the request is retried on the other engine, later ones avoid it", async () => {
    fakeDecode("decode-frozen-kv", { httpAddress: frozenAddr(), kvAddress: frozenAddr() });
    const want = (await (
      await fetch(`http://${c.decode[0]!.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "frozen one", max_tokens: 6, temperature: 0 }),
      })
    ).json()) as { choices: { text: string }[] };
    const first = await post({ prompt: "frozen one", max_tokens: 6, temperature: 0 });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-tl-served")).toBe("disaggregated-retried");
    expect(first.headers.get("x-tl-decode-worker")).toBe("decode-0");
    expect(((await first.json()) as { choices: { text: string }[] }).choices[0]!.text).toBe(want.choices[0]!.text);
    for (let i = 0; i < 3; i++) {
      const r = await post({ prompt: `after the freeze ${i}`, max_tokens: 4, temperature: 0 });
      expect(r.status).toBe(200);
      expect([r.headers.get("x-tl-served"), r.headers.get("x-tl-decode-worker")]).toEqual(["disaggregated", "decode-0"]);
      await r.text();
    }
  });

  test("a decode engine that takes the push but never answers the resume: the first-byte deadline gives the handle back and the request is retried before anything reached the client", async () => {
    fakeDecode("decode-frozen-http", { httpAddress: frozenAddr(), kvAddress: c.decode[0]!.kvAddress });
    const res = await post({ prompt: "resume me elsewhere", max_tokens: 5, temperature: 0, stream: true });
    expect(res.status).toBe(200);
    expect([res.headers.get("x-tl-served"), res.headers.get("x-tl-decode-worker")]).toEqual(["disaggregated-retried", "decode-0"]);
    const events = await sseEvents(res);
    expect(events.at(-1)).toBe("[DONE]");
    // The handle pushed for the frozen engine's resume sat on decode-0's receiver: released, not left to its TTL.
    await waitDecodeIdle();
    const next = await post({ prompt: "and the next one", max_tokens: 3, temperature: 0 });
    expect(next.headers.get("x-tl-decode-worker")).toBe("decode-0");
    await next.text();
  });

  test("an engine that stops between tokens once tokens streamed: the client's stream ends with an error event, and the engine is routed around", async () => {
    const stalling = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch() {
        const body = new ReadableStream({
          start(ctl) {
            ctl.enqueue(new TextEncoder().encode(`data: ${JSON.stringify({ choices: [{ index: 0, token_ids: [65] }] })}\n\n`));
          },
        });
        return new Response(body, { headers: { "content-type": "text/event-stream" } });
      },
    });
    try {
      fakeDecode("decode-stalls", { httpAddress: `127.0.0.1:${stalling.port}`, kvAddress: c.decode[0]!.kvAddress });
      const res = await post({ prompt: "stall after one", max_tokens: 20, temperature: 0, stream: true, return_token_ids: true });
      expect([res.status, res.headers.get("x-tl-decode-worker")]).toEqual([200, "decode-stalls"]);
      const events = (await sseEvents(res)) as ({ choices?: { token_ids?: number[] }[]; error?: { message: string } } | string)[];
      const tokens = events.flatMap((e) => (typeof e === "string" ? [] : (e.choices ?? []).flatMap((x) => x.token_ids ?? [])));
      expect(tokens.length).toBe(2); // P's first token, then the one the stalling engine sent
      const last = events.at(-1) as { error?: { message: string } };
      expect(last.error?.message).toMatch(/generation failed/);
      expect(c.gateway.suspects.has("decode-stalls")).toBe(true);
      const next = await post({ prompt: "somewhere else", max_tokens: 3, temperature: 0 });
      expect(next.headers.get("x-tl-decode-worker")).toBe("decode-0");
      await next.text();
    } finally {
      stalling.stop(true);
    }
  });
});

describe("an engine turning suspect", () => {
  test("re-routes a Prefill waiting on it at once, long before that Prefill's own deadline", async () => {
    // A minute of Prefill deadline: only the suspicion can end this request within the test's time.
    const k = await startTestCluster({ prefill: 1, decode: 1, gateway: { prefillTimeoutMs: 60_000 } });
    const hang = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {}, open() {} } });
    const addr = `127.0.0.1:${hang.port}`;
    const status = create(WorkerStatusSchema, {
      workerId: "decode-hangs",
      role: Role.DECODE,
      kvFormat: 1,
      seq: 1n,
      blockTokens: 4,
      freeBlocks: 100_000,
      model: "fake",
      httpAddress: addr,
      kvAddress: addr,
      grpcAddress: addr,
    });
    k.gateway.registry.beat(status);
    const beating = setInterval(() => k.gateway.registry.beat(status), 30);
    try {
      const pending = fetch(`http://${k.gateway.httpAddress}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "waiting on a frozen engine", max_tokens: 3, temperature: 0 }),
      });
      await Bun.sleep(200);
      // What a stalled stream on that engine elsewhere would do.
      k.gateway.suspects.mark("decode-hangs");
      const res = await pending;
      expect([res.status, res.headers.get("x-tl-served"), res.headers.get("x-tl-decode-worker")]).toEqual([200, "disaggregated-retried", "decode-0"]);
      await res.text();
    } finally {
      clearInterval(beating);
      hang.stop(true);
      await k.stop();
    }
  });
});
