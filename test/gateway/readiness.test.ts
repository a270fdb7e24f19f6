// The gateway is ready (GET /health 200) only once it can serve: a prefill and a decode engine,
// or a both engine, in its registry; alive (GET /health/live) from the start.
import { afterAll, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { fakeServedModel, GATEWAY_TUNING, startLoneGateway } from "../support/nodes.ts";

const nodes: EngineNode[] = [];
afterAll(async () => {
  for (const n of nodes) await n.shutdown();
});

test("gateway not ready until it can serve", async () => {
  const gateway = await startLoneGateway({ frontDoor: { ...GATEWAY_TUNING.frontDoor, apiKeys: ["k"] } });
  const health = async () => {
    const r = await fetch(`http://${gateway.httpAddress}/health`);
    return { code: r.status, ...((await r.json()) as { status: string; workers: Record<string, number> }) };
  };
  const engine = async (role: "prefill" | "decode" | "both") => {
    const n = await startEngineNode({
      role,
      workerId: `${role}-0`,
      model: fakeServedModel(),
      blockTokens: 4,
      numBlocks: 64,
      gatewayRegistry: gateway.registryAddress,
      heartbeatIntervalMs: 100,
      heartbeatTimeoutMs: 500,
    });
    nodes.push(n);
    return n;
  };
  const until = async (want: number) => {
    for (let i = 0; i < 200 && gateway.registry.live().length !== want; i++) await Bun.sleep(10);
  };
  try {
    expect(await health()).toMatchObject({ code: 503, status: "no_engines", workers: { prefill: 0, decode: 0, both: 0 } });
    // Liveness needs no key (probes carry none) and is up from the start.
    expect((await fetch(`http://${gateway.httpAddress}/health/live`)).status).toBe(200);
    await engine("prefill");
    await until(1);
    expect(await health()).toMatchObject({ code: 503, status: "no_engines", workers: { prefill: 1 } });
    const d = await engine("decode");
    await until(2);
    expect(await health()).toMatchObject({ code: 200, status: "ok", workers: { prefill: 1, decode: 1 } });
    // The decode engine leaves: a prefill engine alone cannot serve.
    await d.shutdown();
    await until(1);
    expect((await health()).code).toBe(503);
    await engine("both");
    await until(2);
    expect(await health()).toMatchObject({ code: 200, status: "ok", workers: { both: 1 } });
    await gateway.drain(0);
    expect(await health()).toMatchObject({ code: 503, status: "draining" });
  } finally {
    await gateway.stop();
  }
});
