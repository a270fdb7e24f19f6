// What one peer may hold on a decode engine, and what its handles let others do.
import { expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { buildChunks, KvError, KvReceiver, PushDriver } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { SHAPE } from "./harness.ts";

function pushAs(rx: KvReceiver, peer: string, handleId: string, P: KvPool, tokens: number[]) {
  const pre = fakePrefill(P, tokens)!;
  const push = new PushDriver(rx);
  push.peer = peer;
  try {
    for (const c of buildChunks(
      P,
      handleId,
      pre.ids,
      pre.hashes,
      pre.hashes.map(() => false),
    ))
      push.accept(c);
    return push.finish();
  } catch (e) {
    throw push.fail(e);
  } finally {
    P.releaseAll(pre.ids);
  }
}
const codeOf = (f: () => unknown) => {
  try {
    f();
    return "ok";
  } catch (e) {
    expect(e).toBeInstanceOf(KvError);
    return Code[(e as KvError).code];
  }
};

test("one peer cannot take another peers share", () => {
  const P = new KvPool(SHAPE, 64);
  const D = new KvPool(SHAPE, 16);
  const rx = new KvReceiver(D, {
    ttlMs: 60_000,
    pushIdleTimeoutMs: 10_000,
    maxPending: 8,
    maxInFlight: 4,
    maxBlocksPerPeer: 6,
    maxPendingPerPeer: 3,
    maxInFlightPerPeer: 1,
  });
  try {
    // p-1 fills its block share (3 blocks a push, 6 at most): the third push is refused mid-way, freed
    expect(codeOf(() => pushAs(rx, "p-1", "a", P, fakePrompt(12, 1)))).toBe("ok");
    expect(codeOf(() => pushAs(rx, "p-1", "b", P, fakePrompt(12, 2)))).toBe("ok");
    const used = D.used;
    expect(codeOf(() => pushAs(rx, "p-1", "c", P, fakePrompt(12, 3)))).toBe("ResourceExhausted");
    expect(D.used).toBe(used);
    // ...while p-2 still has its own
    expect(codeOf(() => pushAs(rx, "p-2", "d", P, fakePrompt(12, 4)))).toBe("ok");
    expect(rx.shareOf("p-1")).toEqual({ inFlight: 0, pending: 2, blocks: 6 });
    // pushes in flight, per peer
    const open = rx.begin("e", 2, "p-2");
    expect(codeOf(() => rx.begin("f", 2, "p-2"))).toBe("ResourceExhausted");
    expect(codeOf(() => rx.begin("g", 2, "p-3"))).toBe("ok");
    open.abort();
    // handles pending, per peer (3): p-1 holds 2, one more push slot...
    expect(rx.release("a", "p-1")).toBe(true);
    expect(rx.shareOf("p-1")).toEqual({ inFlight: 0, pending: 1, blocks: 3 });
    // the anonymous peer (plaintext) answers only to the global caps
    expect(codeOf(() => pushAs(rx, "", "h", P, fakePrompt(4, 5)))).toBe("ok");
  } finally {
    rx.close();
  }
  expect(D.used).toBe(0);
});

test("handles are bound to the peer that pushed them", () => {
  const P = new KvPool(SHAPE, 32);
  const D = new KvPool(SHAPE, 16);
  const rx = new KvReceiver(D, { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
  try {
    pushAs(rx, "p-1", "mine", P, fakePrompt(9, 1));
    // another prefill engine cannot release it (nor learn it exists: same answer as unknown)
    expect(rx.release("mine", "p-2")).toBe(false);
    expect(rx.release("nothing", "p-2")).toBe(false);
    expect(rx.pending()).toBe(1);
    // nor push under the same id
    expect(codeOf(() => pushAs(rx, "p-2", "mine", P, fakePrompt(9, 2)))).toBe("AlreadyExists");
    // a claim that finds fault leaves it; the owner (or the gateway: no `by`) releases it
    expect(rx.claim("mine", () => "wrong prompt")).toEqual({ fault: "wrong prompt" });
    expect(rx.pending()).toBe(1);
    expect(rx.release("mine", "p-1")).toBe(true);
    expect(D.used).toBe(0);
  } finally {
    rx.close();
  }
});

test("a quiet push is aborted and freed", () => {
  let now = 1_000;
  const P = new KvPool(SHAPE, 32);
  const D = new KvPool(SHAPE, 16);
  const rx = new KvReceiver(D, { pushIdleTimeoutMs: 500, ttlMs: 60_000, now: () => now });
  try {
    const pre = fakePrefill(P, fakePrompt(12, 1))!;
    const chunks = buildChunks(P, "slow", pre.ids, pre.hashes, [false, false, false]);
    const push = new PushDriver(rx);
    push.peer = "p-1";
    push.accept(chunks[0]!);
    now += 400;
    push.accept(chunks[1]!); // activity resets the clock
    now += 400;
    expect(rx.inFlight()).toBe(1);
    expect(D.used).toBe(2);
    now += 101; // 501 ms without a chunk
    expect(rx.inFlight()).toBe(0);
    expect(D.used).toBe(0);
    expect(rx.shareOf("p-1")).toEqual({ inFlight: 0, pending: 0, blocks: 0 });
    expect(codeOf(() => push.accept(chunks[2]!))).toBe("Aborted");
  } finally {
    rx.close();
  }
});
