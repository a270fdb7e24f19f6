import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { HandoffError, prefillAndPush } from "../../src/handoff/index.ts";
import { startSpan, SpanKind } from "../../src/obs/index.ts";
import type { SamplingParams } from "../../src/engine/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { startGateProxy, type GateProxy } from "../support/gate-proxy.ts";
import { fakeServedModel } from "../support/nodes.ts";
import { PATHS, prefillTransport, settle, snapshot, startDecode, type Decode, type Path } from "../transfer/harness.ts";

// A handle D holds that nobody will claim goes back at once, not at its time to live
// (ten minutes here, so only the prefill side's release can free it within the test).
const TTL_MS = 600_000;
let P: EngineNode;
beforeAll(async () => {
  P = await startEngineNode({ role: "prefill", model: fakeServedModel(), blockTokens: 4, numBlocks: 64 });
});
afterAll(async () => {
  await P?.shutdown();
});

const prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
let seq = 0;

/** D behind proxies on its gRPC and data plane ports (both dialled through them). */
async function decodeBehind(path: Path, proxy: (target: () => string) => Promise<GateProxy>) {
  let d: Decode | undefined;
  const dp = path === "data-plane" ? await proxy(() => d!.server.dataPlaneAddress) : undefined;
  d = await startDecode(path, { shape: P.pool.shape, rx: { ttlMs: TTL_MS }, ...(dp ? { advertiseDataPlane: dp.address } : {}) });
  const grpc = await proxy(() => d!.target);
  return {
    d,
    grpc,
    dp,
    async close() {
      await Promise.all([grpc.close(), dp?.close()]);
      await d!.close();
    },
  };
}

function run(target: string, signal: AbortSignal, transport = prefillTransport("grpc"), sampling: Partial<SamplingParams> = {}) {
  return prefillAndPush(
    { engine: P.engine, transport },
    {
      requestId: `frees-${seq++}`,
      promptTokens: prompt,
      sampling: { temperature: 1, topP: 1, topK: 0, seed: 3n, maxTokens: 8, stopTokenIds: [], ...sampling },
      choices: 1,
      decodeTarget: target,
      signal,
      parent: startSpan("test", SpanKind.INTERNAL),
    },
  );
}

describe.each(PATHS)("%s", (path) => {
  test("D accepts the push but its ack is lost: the prefill side releases the handle, long before its time to live", async () => {
    let rx: Decode["rx"] | undefined;
    // The first bytes D sends while it holds a pending handle go with their connection: the
    // ack (the release after it gets through).
    const net = await decodeBehind(path, (t) => startGateProxy(t, { cutReplyWhen: () => (rx?.pending() ?? 0) > 0, maxCuts: 1 }));
    rx = net.d.rx;
    const transport = prefillTransport(path);
    try {
      const before = snapshot(net.d.pool, rx);
      const err = await run(net.grpc.address, new AbortController().signal, transport).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(HandoffError);
      expect((err as HandoffError).side).toBe("decode");
      expect(net.grpc.cuts() + (net.dp?.cuts() ?? 0)).toBeGreaterThan(0); // it was the ack that went, after D took the handle
      expect(await settle(() => rx!.pending() === 0, 3000)).toBe(true);
      const after = snapshot(net.d.pool, rx);
      // The pushed full blocks may stay cached (unreferenced); nothing is held.
      expect([after.used, after.pending, after.inFlight]).toEqual([before.used, 0, 0]);
      expect(P.pool.used).toBe(0);
    } finally {
      await transport.close();
      await net.close();
    }
  });

  test("the caller cancels while a slow push goes on and then succeeds: the handle is released on D", async () => {
    const net = await decodeBehind(path, (t) => startGateProxy(t, { held: true }));
    const transport = prefillTransport(path);
    try {
      const ac = new AbortController();
      const call = run(net.grpc.address, ac.signal, transport).catch((e: unknown) => e);
      await net.grpc.arrived; // the push has begun (its HasBlocks waits at the proxy)
      ac.abort();
      net.grpc.open();
      net.dp?.open();
      const err = await call;
      expect(err).toBeInstanceOf(HandoffError);
      expect((err as HandoffError).code).toBe(Code.Canceled);
      expect(await settle(() => net.d.rx.pending() === 0, 3000)).toBe(true);
      expect([net.d.pool.used, net.d.rx.inFlight(), P.pool.used]).toEqual([0, 0, 0]);
    } finally {
      await transport.close();
      await net.close();
    }
  });
});

test("a prefill whose own settings leave no token to sample is INVALID_ARGUMENT (the caller's 400), not RESOURCE_EXHAUSTED (429); nothing is pushed or held", async () => {
  // Past the RPC's and HTTP's checks (a repetition penalty of 1e-300 is refused there): the engine's own guard.
  const err = await run("127.0.0.1:1", new AbortController().signal, prefillTransport("grpc"), { repetitionPenalty: 1e-300 }).then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(HandoffError);
  expect([(err as HandoffError).code, (err as HandoffError).message]).toEqual([Code.InvalidArgument, expect.stringContaining("no token can be sampled")]);
  for (let i = 0; i < 200 && P.pool.used > 0; i++) await Bun.sleep(5);
  expect(P.pool.used).toBe(0);
});
