import { expect, test } from "bun:test";
import { parseArgs } from "../../src/cli/options.ts";
import { runEngine } from "../../src/cli/run-engine.ts";
import { roleArgs } from "../../src/cli/spawn-role.ts";
import { KvPool } from "../../src/pool/index.ts";
import { acceptAll, buildChunks, KvReceiver } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { SHAPE } from "../transfer/harness.ts";

function pushOne(P: KvPool, rx: KvReceiver, handle: string): void {
  const pre = fakePrefill(P, fakePrompt(2 * P.shape.blockTokens + 1, handle.length))!;
  acceptAll(
    rx,
    buildChunks(
      P,
      handle,
      pre.ids,
      pre.hashes,
      pre.hashes.map(() => false),
    ),
  );
  P.releaseAll(pre.ids);
}

test("the receiver reports each handle its time to live freed, and only those", () => {
  let t = 0;
  const expired: string[] = [];
  const P = new KvPool(SHAPE, 32);
  const D = new KvPool(SHAPE, 32);
  const rx = new KvReceiver(D, { pushIdleTimeoutMs: 10_000, ttlMs: 1000, now: () => t, onExpired: (h) => expired.push(h) });
  try {
    for (const h of ["claimed", "released", "left"]) pushOne(P, rx, h);
    D.releaseAll(rx.claim("claimed")!.blockIds);
    rx.release("released");
    t = 999;
    expect([rx.pending(), expired]).toEqual([1, []]);
    t = 1000;
    expect([rx.pending(), expired, D.used]).toEqual([0, ["left"], 0]);
  } finally {
    rx.close();
  }
});

test("tl_kv_handles_expired_total counts an unclaimed handle on a decode engine's /metrics", async () => {
  const { config } = parseArgs(roleArgs("decode", ["--handle-ttl-s", "1"]));
  const node = await runEngine(config);
  try {
    const metric = async () => {
      const text = await (await fetch(`http://${node.httpAddress}/metrics`)).text();
      return Number(/^tl_kv_handles_expired_total (\d+)/m.exec(text)?.[1]);
    };
    expect(await metric()).toBe(0);
    pushOne(new KvPool(node.pool.shape, 8), node.receiver!, "nobody-claims-me");
    expect(node.receiver!.pending()).toBe(1);
    const end = Date.now() + 5000;
    while (node.receiver!.pending() > 0 && Date.now() < end) await Bun.sleep(50);
    expect([node.receiver!.pending(), node.pool.used, await metric()]).toEqual([0, 0, 1]);
  } finally {
    await node.shutdown();
  }
}, 15_000);
