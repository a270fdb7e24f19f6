import { expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { buildChunks, GrpcCode, KvError, KvReceiver } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { SHAPE, snapshot } from "./harness.ts";

function code(f: () => unknown): number {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(KvError);
    return (e as KvError).code;
  }
  throw new Error("expected a KvError");
}

test("receiver_caps_duplicates_and_shortage", () => {
  const P = new KvPool(SHAPE, 32);
  const D = new KvPool(SHAPE, 6);
  const rx = new KvReceiver(D, { maxPending: 2, maxInFlight: 1 });
  try {
    const tokens = fakePrompt(9, 5);
    const pre = fakePrefill(P, tokens)!;
    const none = [false, false];
    rx.acceptAll(buildChunks(P, "a", pre.ids, pre.hashes, none));
    expect(code(() => rx.acceptAll(buildChunks(P, "a", pre.ids, pre.hashes, none)))).toBe(GrpcCode.ALREADY_EXISTS);
    const open = rx.begin("b", 3);
    expect(code(() => rx.begin("b", 3))).toBe(GrpcCode.ALREADY_EXISTS);
    expect(code(() => rx.begin("c", 3))).toBe(GrpcCode.RESOURCE_EXHAUSTED); // in flight
    open.abort();
    rx.acceptAll(buildChunks(P, "b", pre.ids, pre.hashes, [true, true]));
    expect(code(() => rx.begin("c", 3))).toBe(GrpcCode.RESOURCE_EXHAUSTED); // pending
    expect(rx.release("a")).toBe(true);
    expect(rx.release("b")).toBe(true);

    // the pool runs dry mid-push: nothing stays taken
    const base = snapshot(D, rx);
    const long = fakePrefill(P, fakePrompt(28, 6))!;
    expect(code(() => rx.acceptAll(buildChunks(P, "d", long.ids, long.hashes, long.hashes.map(() => false))))).toBe(
      GrpcCode.RESOURCE_EXHAUSTED,
    );
    // Allocating may have evicted cached blocks (an LRU cache's ordinary cost); nothing is held.
    const after = snapshot(D, rx);
    expect({ ...after, free: after.free + after.cached, cached: 0 }).toEqual({ ...base, free: base.free + base.cached, cached: 0 });

    // a hashless (partial) block before the last chunk would shift every later token
    const chunks = buildChunks(P, "e", pre.ids, pre.hashes, none);
    const before = snapshot(D, rx);
    expect(code(() => rx.acceptAll([chunks[0]!, { ...chunks[2]!, index: 1 }, { ...chunks[1]!, index: 2 }]))).toBe(GrpcCode.INVALID_ARGUMENT);
    expect(snapshot(D, rx)).toEqual(before);
    P.releaseAll(pre.ids);
    P.releaseAll(long.ids);
  } finally {
    rx.close();
  }
});
