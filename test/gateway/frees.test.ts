import { afterEach, expect, test } from "bun:test";
import { HANDLE_HEADER } from "../../src/http/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { startGateProxy, type GateProxy } from "../support/gate-proxy.ts";
import { sseEvents, startTestCluster, type TestCluster } from "../support/nodes.ts";

// Every way a disaggregated request can break leaves every engine as it was: no block
// referenced, no handle pending, nothing in flight. Handles live ten minutes here, so
// only a release on the failing path can free one within a test.
const realFetch = globalThis.fetch;
let c: TestCluster | undefined;
const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  globalThis.fetch = realFetch;
  for (const close of closers.splice(0).reverse()) await close();
  await c?.stop();
  c = undefined;
});

async function cluster(node: Parameters<typeof startTestCluster>[0]["node"] = {}): Promise<TestCluster> {
  c = await startTestCluster({ prefill: 1, decode: 1, node: { handleTtlS: 600, ...node } });
  return c;
}

const state = (k: TestCluster) =>
  k.all().map((n) => ({ worker: n.workerId, used: n.pool.used, pending: n.receiver?.pending() ?? 0, inFlight: n.engine.inFlight }));

/** Polls (bounded, far below the time to live) until every engine is back at baseline. */
async function baseline(k: TestCluster, maxMs = 3000): Promise<void> {
  const end = Date.now() + maxMs;
  const idle = () => state(k).every((s) => s.used === 0 && s.pending === 0 && s.inFlight === 0);
  while (!idle() && Date.now() < end) await Bun.sleep(5);
  expect(state(k)).toEqual(k.all().map((n) => ({ worker: n.workerId, used: 0, pending: 0, inFlight: 0 })));
}

const post = (k: TestCluster, body: unknown, signal?: AbortSignal) =>
  realFetch(`http://${k.gateway.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(body), signal });

/** Runs `f` before each of P's forwards (the prefill). */
function onPrefillForward(k: TestCluster, f: () => void): void {
  const runner = k.prefill[0]!.model.runner as FakeRunner;
  const forward = runner.forward.bind(runner);
  runner.forward = (...a) => {
    f();
    forward(...a);
  };
}

/** Steers the gateway's resume to D: `f` gets its URL and init and answers for it. */
function onResume(k: TestCluster, f: (url: string, init: RequestInit) => Promise<Response>): void {
  const d = `http://${k.decode[0]!.httpAddress}/`;
  globalThis.fetch = ((input: string | URL | Request, init?: RequestInit) => {
    const url = String(input);
    const isResume = url.startsWith(d) && new Headers(init?.headers).has(HANDLE_HEADER);
    return isResume ? f(url, init ?? {}) : realFetch(input, init);
  }) as typeof fetch;
}

type Event = { error?: { message: string }; choices?: { finish_reason: string | null }[] } | string;

/** The client saw an error last, and never a finish or [DONE]. */
function endsInError(events: Event[]): void {
  expect(typeof events.at(-1) === "string" ? undefined : (events.at(-1) as { error?: unknown }).error).toBeDefined();
  expect(events).not.toContain("[DONE]");
  expect(events.some((e) => typeof e !== "string" && e.choices?.some((x) => x.finish_reason !== null))).toBe(false);
}

test("D refuses the resume (it began draining after the push): the gateway releases the handle at once", async () => {
  const k = await cluster();
  const D = k.decode[0]!;
  onPrefillForward(k, () => void D.engine.drain(0));
  const res = await post(k, { prompt: "hello there", max_tokens: 8, stream: true });
  expect(res.status).toBe(200);
  endsInError((await sseEvents(res)) as Event[]);
  expect(D.engine.isDraining).toBe(true);
  await baseline(k);
});

test("the client leaves while the resume waits for D's answer (D never claimed): the gateway releases the handle", async () => {
  const k = await cluster();
  const D = k.decode[0]!;
  let reached!: () => void;
  const resumed = new Promise<void>((r) => (reached = r));
  // The resume never reaches D before the client goes: it waits for the abort.
  onResume(k, (_url, init) => {
    reached();
    return new Promise((_, reject) => init.signal!.addEventListener("abort", () => reject(init.signal!.reason)));
  });
  const ac = new AbortController();
  const res = post(k, { prompt: "hello there", max_tokens: 8, stream: true }, ac.signal).catch((e: unknown) => e);
  await resumed;
  expect(D.receiver!.pending()).toBe(1);
  ac.abort();
  expect(await res).toBeInstanceOf(Error);
  await baseline(k);
});

test("the client leaves after the 200 headers, once D claimed the handle: D cancels the request and frees it", async () => {
  const k = await cluster();
  const D = k.decode[0]!;
  // 450 tokens at 10 ms a step: D would run past the baseline's deadline unless it cancels.
  (D.model.runner as FakeRunner).slowMs = 10;
  const ac = new AbortController();
  const res = await post(k, { prompt: "hello there", max_tokens: 450, ignore_eos: true, stream: true }, ac.signal);
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  expect((await reader.read()).done).toBe(false);
  expect([D.receiver!.pending(), D.engine.inFlight]).toEqual([0, 1]); // claimed and running
  ac.abort();
  await baseline(k);
});

test("the client disconnects while P is still prefilling: P's work is cancelled and nothing stays anywhere", async () => {
  // A 120-token prompt in 8-token chunks at 10 ms each: the abort lands between chunks.
  const k = await cluster({ maxBatchTokens: 8 });
  const P = k.prefill[0]!;
  (P.model.runner as FakeRunner).slowMs = 10;
  let started!: () => void;
  const prefilling = new Promise<void>((r) => (started = r));
  onPrefillForward(k, () => started());
  const ac = new AbortController();
  const res = post(k, { prompt: "x".repeat(120), max_tokens: 8, stream: true }, ac.signal).catch((e: unknown) => e);
  await prefilling;
  ac.abort();
  expect(await res).toBeInstanceOf(Error); // the client sees its request fail, never a response
  await baseline(k);
  expect(k.decode[0]!.receiver!.pending()).toBe(0);
});

/**
 * A cluster whose D's KvTransfer is reached through a proxy that holds every push until
 * `kv.open()`; `cancelSeen` settles when a Cancel reaches P.
 */
async function heldPushCluster(): Promise<{ k: TestCluster; kv: GateProxy; cancelSeen: Promise<void> }> {
  let k!: TestCluster;
  const kv: GateProxy = await startGateProxy(() => k.decode[0]!.kvAddress, { held: true });
  closers.push(() => kv.close());
  k = await cluster({ advertiseKvAddress: kv.address });
  const P = k.prefill[0]!;
  let cancelled!: () => void;
  const cancelSeen = new Promise<void>((r) => (cancelled = r));
  const cancel = P.engine.cancel.bind(P.engine);
  P.engine.cancel = (...a) => {
    cancelled();
    return cancel(...a);
  };
  return { k, kv, cancelSeen };
}

test("the client disconnects while P pushes: the handle the Prefill still yields is released on D", async () => {
  const { k, kv, cancelSeen } = await heldPushCluster();
  const ac = new AbortController();
  const res = post(k, { prompt: "hello there", max_tokens: 8, stream: true }, ac.signal).catch((e: unknown) => e);
  await kv.arrived; // the push has begun
  ac.abort();
  expect(await res).toBeInstanceOf(Error);
  await cancelSeen; // the gateway's Cancel reached P after its prefill ended
  kv.open();
  await baseline(k);
});

test("the gateway stops while P pushes: stop() waits to release the handle the Prefill still yields", async () => {
  const { k, kv, cancelSeen } = await heldPushCluster();
  const res = post(k, { prompt: "hello there", max_tokens: 8, stream: true }).catch((e: unknown) => e);
  await kv.arrived; // the push has begun
  let stopDone = false;
  const stopped = k.gateway.stop().then(() => (stopDone = true)); // cuts the client: the gateway abandons the Prefill
  await cancelSeen;
  await Bun.sleep(100);
  // Still stopping: it owes D the release of a handle, and the releaser must be open for it.
  expect(stopDone).toBe(false);
  kv.open(); // the Prefill now yields its handle
  await stopped;
  expect(await res).toBeInstanceOf(Error);
  expect(k.decode[0]!.receiver!.pending()).toBe(0); // released before stop() resolved, not at its TTL
  await baseline(k);
});

test("a hard reset of D's connection mid-stream: the client's last event is an error, and D frees the request", async () => {
  const k = await cluster();
  const D = k.decode[0]!;
  // 450 tokens at 10 ms a step: D would run past the baseline's deadline unless it cancels.
  (D.model.runner as FakeRunner).slowMs = 10;
  let replies = 0;
  // After a few of D's writes (the headers and some tokens), both sides are reset.
  const http = await startGateProxy(D.httpAddress, { cutReplyWhen: () => ++replies > 4, maxCuts: 1 });
  closers.push(() => http.close());
  onResume(k, (url, init) => realFetch(url.replace(D.httpAddress, http.address), init));
  const res = await post(k, { prompt: "hello there", max_tokens: 450, ignore_eos: true, stream: true });
  expect(res.status).toBe(200);
  const events = (await sseEvents(res)) as Event[];
  expect(http.cuts()).toBe(1);
  expect(events.length).toBeGreaterThan(1); // some tokens came through first
  endsInError(events);
  await baseline(k);
});
