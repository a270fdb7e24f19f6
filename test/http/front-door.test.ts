import { afterAll, expect, test } from "bun:test";
import { apiKeysFrom } from "../../src/http/front-door.ts";
import { serveHttp } from "../../src/http/serve-http.ts";
import { GATEWAY_CONFIG_DEFAULTS } from "../../src/cli/options.ts";
import { httpListener } from "../../src/cli/security.ts";

/** The listener's bounds as [gateway] has them by default. */
const LISTENER = httpListener(GATEWAY_CONFIG_DEFAULTS);

let reached = 0;
let lastBody = 0;
const server = await serveHttp(
  async (req) => {
    reached++;
    if (req.body) lastBody = (await req.arrayBuffer()).byteLength;
    return Response.json({ ok: true, aborted: req.signal.aborted });
  },
  { ...LISTENER, apiKeys: ["k-one", "k-two"], maxRequestBytes: 1000 },
);
const metricsLocked = await serveHttp(() => new Response("m"), { ...LISTENER, apiKeys: ["k"], metricsNeedKey: true, maxRequestBytes: 1000 });
afterAll(async () => {
  await server.stop();
  await metricsLocked.stop();
});
const url = (p: string, s = server) => `http://${s.address}${p}`;

test("api key guards the front door", async () => {
  const before = reached;
  for (const auth of [undefined, "Bearer nope", "k-one", "Basic k-one", "Bearer k-one extra", "Bearer "]) {
    const res = await fetch(url("/v1/completions"), { method: "POST", body: "{}", headers: auth ? { authorization: auth } : {} });
    expect(res.status).toBe(401);
    expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
    const body = (await res.json()) as { error: { message: string; type: string } };
    expect(body.error.type).toBe("authentication_error");
    expect(body.error.message).not.toContain("k-one");
  }
  // any path but the probes needs the key: a router normalising // must not open a hole
  expect((await fetch(url("//v1/models"))).status).toBe(401);
  expect((await fetch(url("/v1/models"), { headers: { authorization: "Bearer k-two" } })).status).toBe(200);
  expect((await fetch(url("/v1/models"), { headers: { authorization: "bearer k-one" } })).status).toBe(200);
  expect(reached).toBe(before + 2);
  expect((await fetch(url("/health"))).status).toBe(200);
  expect((await fetch(url("/metrics"))).status).toBe(200);
  expect((await fetch(url("/metrics", metricsLocked))).status).toBe(401);
  expect((await fetch(url("/metrics", metricsLocked), { headers: { authorization: "Bearer k" } })).status).toBe(200);
  expect((await fetch(url("/health", metricsLocked))).status).toBe(200);
});

test("bodies over max request bytes get 413 unread", async () => {
  const auth = { authorization: "Bearer k-one" };
  const before = reached;
  const big = await fetch(url("/v1/completions"), { method: "POST", body: "x".repeat(1001), headers: auth });
  expect(big.status).toBe(413);
  expect(((await big.json()) as { error: { message: string } }).error.message).toMatch(/1001 bytes exceeds max_request_bytes \(1000\)/);
  // chunked: no content-length, counted as it streams
  const chunks = (n: number, size: number) =>
    new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < n; i++) c.enqueue(new Uint8Array(size));
        c.close();
      },
    });
  const streamed = await fetch(url("/v1/completions"), { method: "POST", body: chunks(10, 200), headers: auth });
  expect(streamed.status).toBe(413);
  expect(reached).toBe(before);
  const fits = await fetch(url("/v1/completions"), { method: "POST", body: chunks(5, 200), headers: auth });
  expect(fits.status).toBe(200);
  expect(lastBody).toBe(1000);
  expect(await fits.json()).toEqual({ ok: true, aborted: false });
  const exact = await fetch(url("/v1/completions"), { method: "POST", body: "y".repeat(1000), headers: auth });
  expect(exact.status).toBe(200);
});

test("api keys from env", () => {
  expect(apiKeysFrom(["a"], " b, c ,")).toEqual(["a", "b", "c"]);
  expect(apiKeysFrom([], undefined)).toEqual([]);
});
