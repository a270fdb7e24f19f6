// Every input has a bound checked before work (issue: inputs_are_bounded), and what a
// refused input touched is back at baseline afterwards.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { KV_FORMAT } from "../../src/codec/index.ts";
import { Role, WorkerRegistry, WorkerStatusSchema } from "../../src/gen/tl/control/v1/control_pb.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { KvReceiver, serveDataPlane } from "../../src/transfer/index.ts";
import { startTestCluster, type TestCluster, GATEWAY_TUNING } from "../support/nodes.ts";
import { SHAPE } from "../transfer/harness.ts";

let c: TestCluster;
beforeAll(async () => {
  // Beats every second: the attacks below keep this one process busy for a while.
  c = await startTestCluster({
    prefill: 1,
    decode: 1,
    intervalMs: 1000,
    gateway: { maxWorkers: 3, frontDoor: { ...GATEWAY_TUNING.frontDoor, maxRequestBytes: 1 << 20 } },
  });
});
afterAll(async () => {
  await c?.stop();
});

const gw = (path: string, body: string | Uint8Array, headers: Record<string, string> = {}) =>
  fetch(`http://${c.gateway.httpAddress}${path}`, { method: "POST", body, headers: { "content-type": "application/json", ...headers } });
const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => "ok",
    (e: unknown) => (e instanceof ConnectError ? Code[e.code] : String(e)),
  );
const atBaseline = () => {
  for (const n of c.all())
    expect({ worker: n.workerId, used: n.pool.used, pending: n.receiver?.pending() ?? 0 }).toEqual({ worker: n.workerId, used: 0, pending: 0 });
};

describe("inputs are bounded", () => {
  test("request bodies over max_request_bytes: 413 before parsing, memory at baseline", async () => {
    Bun.gc(true);
    const rss0 = process.memoryUsage().rss;
    for (const mb of [30, 60]) {
      const res = await gw("/v1/chat/completions", new Uint8Array(mb << 20).fill(0x61));
      expect(res.status).toBe(413);
      const body = (await res.json()) as { error: { message: string } };
      expect(body.error.message).toMatch(/exceeds max_request_bytes \(1048576\)/);
    }
    Bun.gc(true);
    // (the request buffers themselves were made here, by the test; the gateway kept none of it)
    expect(process.memoryUsage().rss - rss0).toBeLessThan(256 << 20);
    atBaseline();
  });

  test("prompts longer than the context, huge stop strings and stop ids: 400 without tokenizing", async () => {
    const t0 = performance.now();
    const cases: [unknown, RegExp][] = [
      [{ prompt: "x".repeat(900_000), max_tokens: 1 }, /longer than the context/],
      [{ prompt: "hi", max_tokens: 1, stop: "s".repeat(900_000) }, /stop sequence of 900000 characters/],
      [{ prompt: "hi", max_tokens: 1, stop_token_ids: new Array(100_000).fill(1) }, /stop_token_ids has 100000 entries/],
      [{ prompt: new Array(100_000).fill(1), max_tokens: 1 }, /prompt of 100000 tokens exceeds/],
    ];
    for (const [body, says] of cases) {
      const res = await gw("/v1/completions", JSON.stringify(body));
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(says);
    }
    expect(performance.now() - t0).toBeLessThan(5000);
    atBaseline();
  });

  test("EngineControl: oversized messages and prompts are refused before work", async () => {
    const ctl = grpcClient(EngineControl, c.prefill[0]!.grpcAddress);
    // Each request differs from a valid one only in its prompt.
    const prefill = (prompt: { prompt: string } | { promptTokens: number[] }) =>
      ctl
        .prefill(
          create(PrefillRequestSchema, { requestId: "r", ...prompt, decodeTarget: c.decode[0]!.kvAddress, kvFormat: KV_FORMAT, sampling: { maxTokens: 1 } }),
        )
        .catch((e: ConnectError) => e);
    const big = await prefill({ prompt: "x".repeat(5 << 20) });
    expect((big as ConnectError).code).toBe(Code.ResourceExhausted);
    const long = await prefill({ prompt: "x".repeat(1 << 20) });
    expect((long as ConnectError).rawMessage).toMatch(/cannot fit max_model_len/);
    const ids = await prefill({ promptTokens: new Array(100_000).fill(1) });
    expect((ids as ConnectError).rawMessage).toMatch(/prompt of 100000 tokens exceeds/);
    atBaseline();
  });

  test("heartbeats: size capped, and the registry holds at most max_workers", async () => {
    // The attacker's own connection (grpcClient would share the engines' cached one).
    const attacker = () => createClient(WorkerRegistry, createGrpcTransport({ baseUrl: `http://${c.gateway.registryAddress}`, defaultTimeoutMs: 10_000 }));
    let reg = attacker();
    const beat = (workerId: string, extra = {}) =>
      create(WorkerStatusSchema, {
        workerId,
        role: Role.DECODE,
        kvFormat: KV_FORMAT,
        httpAddress: "127.0.0.1:1",
        grpcAddress: "127.0.0.1:2",
        kvAddress: "127.0.0.1:3",
        model: "fake",
        blockTokens: 4,
        totalBlocks: 8,
        ...extra,
      });
    // a 50 MB heartbeat
    expect(await codeOf(reg.heartbeat(beat("fat", { model: "m".repeat(50 << 20) })))).toBe("ResourceExhausted");
    await c.waitForWorkers(2);
    reg = attacker(); // the oversized message ended that connection
    expect(await codeOf(reg.heartbeat(beat("fake-1")))).toBe("ok");
    // 2,000 fake workers: all but the first refused, the real ones still listed and beating
    const refused = await Promise.all(Array.from({ length: 200 }, (_, i) => codeOf(reg.heartbeat(beat(`fake-${i + 2}`)))));
    expect(new Set(refused)).toEqual(new Set(["ResourceExhausted"]));
    expect(c.gateway.registry.list().length).toBeLessThanOrEqual(3);
    await c.waitForWorkers(3, 20_000);
    expect(c.gateway.registry.list().map((w) => w.status.workerId)).toEqual(["decode-0", "fake-1", "prefill-0"]);
    expect(await codeOf(reg.heartbeat(beat("fake-1")))).toBe("ok"); // a known worker keeps beating
  });
});

test("inputs_are_bounded: the data plane caps connections and cuts idle ones", async () => {
  const rx = new KvReceiver(new KvPool(SHAPE, 8), { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
  const dp = await serveDataPlane(rx, { maxConnections: 4, idleTimeoutMs: 1000 });
  const port = Number(dp.address.slice(dp.address.lastIndexOf(":") + 1));
  const closed: boolean[] = [];
  const socks = await Promise.all(
    Array.from({ length: 10 }, (_, i) => Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {}, close: () => void (closed[i] = true) } })),
  );
  await Bun.sleep(200);
  // beyond the cap: cut at once
  expect(closed.filter(Boolean).length).toBe(6);
  // the rest, idle: cut after the timeout (Bun's socket timeout has a one-second grain)
  const end = Date.now() + 4000;
  while (closed.filter(Boolean).length < 10 && Date.now() < end) await Bun.sleep(50);
  expect(closed.filter(Boolean).length).toBe(10);
  for (const s of socks) s.end();
  await dp.close();
  rx.close();
});
