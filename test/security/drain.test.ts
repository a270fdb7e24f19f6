import { afterAll, beforeAll, expect, test } from "bun:test";
import { Code, type ConnectError } from "@connectrpc/connect";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

let c: TestCluster;
beforeAll(async () => {
  c = await startTestCluster({ both: 1, node: { numBlocks: 64 } });
});
afterAll(async () => {
  await c?.stop();
});

test("drain honours its deadline and health turns not ready", async () => {
  const e = c.both[0]!;
  const http = (p: string) => fetch(`http://${e.httpAddress}${p}`);
  expect((await http("/health")).status).toBe(200);
  // A request that cannot end before the deadline (400 steps of at least 5 ms), then Drain
  // with a 200 ms deadline: it must come back with that request still running.
  (e.model.runner as FakeRunner).slowMs = 5;
  const long = fetch(`http://${e.httpAddress}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ prompt: "a long one", max_tokens: 400, stream: true, ignore_eos: true }),
  });
  const res = await long;
  expect(res.status).toBe(200);
  const body = res.text();
  const ctl = grpcClient(EngineControl, e.grpcAddress);
  const drained = await ctl.drain({ deadlineMs: 200n });
  expect(drained.remaining).toBe(1);
  // what was still running at the deadline was cut, not left to run for ever
  await body;
  expect(e.engine.requestIds()).toEqual([]);
  // not ready (503) for good, but alive
  const h = await http("/health");
  expect(h.status).toBe(503);
  expect(await h.json()).toMatchObject({ status: "draining", tls: "plaintext" });
  expect((await http("/health/live")).status).toBe(200);
  expect((await fetch(`http://${e.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: "late", max_tokens: 2 }) })).status).toBe(503);
  // a deadline beyond any grace period is refused
  const huge = await ctl.drain({ deadlineMs: 10n ** 12n }).catch((err: ConnectError) => err);
  expect((huge as ConnectError).code).toBe(Code.InvalidArgument);
  expect(e.pool.used).toBe(0);
});
