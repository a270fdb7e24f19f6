// Slow clients are cut off, and a crowd of connections cannot take /health down: every HTTP
// listener (serveHttp: the gateway's and each engine's) bounds the time to send headers and a
// body, and the connections open at once with a reserve the probes alone may use.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import * as net from "node:net";
import { ConfigError, GATEWAY_CONFIG_DEFAULTS } from "../../src/cli/options.ts";
import { securityFrom } from "../../src/cli/security.ts";
import { type HttpServer, serveHttp } from "../../src/http/index.ts";
import { GATEWAY_TUNING, startTestCluster } from "../support/nodes.ts";

let S: HttpServer;
let reached = 0;
beforeAll(async () => {
  S = await serveHttp(
    async (req) => {
      reached++;
      const body = req.body ? await req.text() : "";
      return Response.json({ path: new URL(req.url).pathname, bytes: body.length });
    },
    { headersTimeoutS: 2, bodyTimeoutS: 2, maxConnections: 10, healthReserve: 2, maxRequestBytes: 4 * 1024 * 1024 },
  );
});
afterAll(() => S?.stop());

interface Conn {
  socket: net.Socket;
  /** Everything the server sent so far. */
  text(): string;
  /** Resolves with the ms from open to close (or null if still open after `ms`). */
  closedWithin(ms: number): Promise<number | null>;
  /** Resolves once the server sent `n` complete responses (by their status lines). */
  responses(n: number): Promise<void>;
}

function connect(port = S.port): Conn {
  const socket = net.connect(port, "127.0.0.1");
  const t0 = Date.now();
  let got = "";
  let closedAt: number | null = null;
  socket.on("data", (d) => (got += String(d)));
  socket.on("error", () => {});
  const closed = new Promise<void>((r) => socket.once("close", () => ((closedAt = Date.now() - t0), r())));
  return {
    socket,
    text: () => got,
    closedWithin: (ms) => Promise.race([closed.then(() => closedAt), Bun.sleep(ms).then(() => closedAt)]),
    async responses(n) {
      for (let i = 0; i < 500 && (got.match(/HTTP\/1\.1 \d{3}/g) ?? []).length < n; i++) await Bun.sleep(10);
    },
  };
}

/** Writes `s` one character every `everyMs`, until the socket closes. */
function drip(c: Conn, s: string, everyMs: number): void {
  let i = 0;
  const t = setInterval(() => (c.socket.destroyed || i >= s.length ? clearInterval(t) : c.socket.write(s[i++]!)), everyMs);
}

describe("deadlines", () => {
  test("headers sent a byte every 300 ms: 408 at the headers deadline, connection closed", async () => {
    const c = connect();
    drip(c, `GET /v1/models HTTP/1.1\r\nHost: x\r\n${"X-Slow: y\r\n".repeat(50)}\r\n`, 300);
    const at = await c.closedWithin(6000);
    expect(at).not.toBeNull();
    expect(at!).toBeLessThan(4000);
    expect(c.text()).toMatch(/^HTTP\/1\.1 408 .*request headers not received within 2 s/s);
  });

  test("a body sent a byte every 300 ms (with a Content-Length, and chunked): 408 at the body deadline; the handler never ran", async () => {
    const before = reached;
    for (const head of ["Content-Length: 100\r\n\r\n", "Transfer-Encoding: chunked\r\n\r\n"]) {
      const c = connect();
      c.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${head}`);
      drip(c, head.startsWith("Content") ? "x".repeat(100) : "1\r\nx\r\n".repeat(100), 300);
      const at = await c.closedWithin(7000);
      expect({ head, closed: at !== null && at < 5000 }).toEqual({ head, closed: true });
      expect(c.text()).toMatch(/^HTTP\/1\.1 408 .*request body not received within 2 s \(body_timeout_s\)/s);
    }
    expect(reached).toBe(before);
  });

  test("a second request's headers on a kept-alive connection are bounded too", async () => {
    const c = connect();
    c.socket.write("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    await c.responses(1);
    expect(c.text()).toContain('"path":"/a"');
    drip(c, `GET /b HTTP/1.1\r\nHost: x\r\n${"X-Slow: y\r\n".repeat(50)}\r\n`, 300);
    const at = await c.closedWithin(8000);
    expect(at).not.toBeNull();
    expect(c.text()).not.toContain('"path":"/b"');
  });

  test("a body that arrives in time is served whole", async () => {
    const res = await fetch(`http://${S.address}/v1/completions`, { method: "POST", body: "y".repeat(300_000) });
    expect(await res.json()).toEqual({ path: "/v1/completions", bytes: 300_000 });
  });
});

describe("open connections", () => {
  test("past max - reserve only the probes get in, each on a connection closed after it; past max, nothing", async () => {
    // Eight connections hold the room for requests (kept alive after a request).
    const held: Conn[] = [];
    for (let i = 0; i < 8; i++) {
      const c = connect();
      c.socket.write("GET /held HTTP/1.1\r\nHost: x\r\n\r\n");
      await c.responses(1);
      held.push(c);
    }
    expect(S.openConnections).toBe(8);
    const api = connect();
    api.socket.write("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    expect(await api.closedWithin(3000)).not.toBeNull();
    expect(api.text()).toMatch(/^HTTP\/1\.1 503 .*retry-after: 1\r\n.*too many open connections/s);
    // /health on the reserve, on a connection the server closes after its answer.
    const probe = connect();
    probe.socket.write("GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
    expect(await probe.closedWithin(3000)).not.toBeNull();
    expect(probe.text()).toMatch(/^HTTP\/1\.1 200 .*"path":"\/health"/s);
    // Two more fill the reserve; past max a connection is closed before a byte is read.
    const reserve = [connect(), connect()];
    for (let i = 0; i < 100 && S.openConnections < 10; i++) await Bun.sleep(5);
    const over = connect();
    expect(await over.closedWithin(2000)).not.toBeNull();
    expect(over.text()).toBe("");
    for (const c of [...held, ...reserve]) c.socket.destroy();
    for (let i = 0; i < 200 && S.openConnections > 0; i++) await Bun.sleep(5);
    expect((await fetch(`http://${S.address}/v1/models`)).status).toBe(200);
  });
});

describe("the options", () => {
  test("every role's listener takes them; a reserve as large as the cap is refused at start", async () => {
    const section = { ...GATEWAY_CONFIG_DEFAULTS, http_max_connections: 4, http_health_reserve: 4 };
    expect(() => securityFrom(section, "gateway", ["127.0.0.1"])).toThrow(ConfigError);
    const C = await startTestCluster({
      both: 1,
      node: { frontDoor: { maxConnections: 3, healthReserve: 1 } },
      gateway: { frontDoor: { ...GATEWAY_TUNING.frontDoor, maxConnections: 3, healthReserve: 1 } },
    });
    try {
      for (const addr of [C.gateway.httpAddress, C.both[0]!.httpAddress]) {
        const held = [connect(Number(addr.split(":")[1])), connect(Number(addr.split(":")[1]))];
        for (const h of held) h.socket.write("GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n");
        for (const h of held) await h.responses(1);
        expect((await fetch(`http://${addr}/v1/models`, { headers: { connection: "close" } })).status).toBe(503);
        expect((await fetch(`http://${addr}/health/live`, { headers: { connection: "close" } })).status).toBe(200);
        for (const h of held) h.socket.destroy();
      }
    } finally {
      await C.stop();
    }
  });
});
