import { expect, test } from "bun:test";
import { crc32c } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { acceptAll, buildChunks, KvError, KvReceiver } from "../../src/transfer/index.ts";
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

test("receiver caps duplicates and shortage", () => {
  const P = new KvPool(SHAPE, 32);
  const D = new KvPool(SHAPE, 6);
  const rx = new KvReceiver(D, { ttlMs: 60_000, pushIdleTimeoutMs: 10_000, maxPending: 2, maxInFlight: 1 });
  try {
    const tokens = fakePrompt(9, 5);
    const pre = fakePrefill(P, tokens)!;
    const none = [false, false];
    acceptAll(rx, buildChunks(P, "a", pre.ids, pre.hashes, none));
    expect(code(() => acceptAll(rx, buildChunks(P, "a", pre.ids, pre.hashes, none)))).toBe(Code.AlreadyExists);
    const open = rx.begin("b", 3);
    expect(code(() => rx.begin("b", 3))).toBe(Code.AlreadyExists);
    expect(code(() => rx.begin("c", 3))).toBe(Code.ResourceExhausted); // in flight
    open.abort();
    acceptAll(rx, buildChunks(P, "b", pre.ids, pre.hashes, [true, true]));
    expect(code(() => rx.begin("c", 3))).toBe(Code.ResourceExhausted); // pending
    expect(rx.release("a")).toBe(true);
    expect(rx.release("b")).toBe(true);

    // the pool runs dry mid-push: nothing stays taken
    const base = snapshot(D, rx);
    const long = fakePrefill(P, fakePrompt(28, 6))!;
    expect(
      code(() =>
        acceptAll(
          rx,
          buildChunks(
            P,
            "d",
            long.ids,
            long.hashes,
            long.hashes.map(() => false),
          ),
        ),
      ),
    ).toBe(Code.ResourceExhausted);
    // Allocating may have evicted cached blocks (an LRU cache's ordinary cost); nothing is held.
    const after = snapshot(D, rx);
    expect({ ...after, free: after.free + after.cached, cached: 0 }).toEqual({ ...base, free: base.free + base.cached, cached: 0 });

    // a hashless (partial) block before the last chunk would shift every later token
    const chunks = buildChunks(P, "e", pre.ids, pre.hashes, none);
    const before = snapshot(D, rx);
    expect(code(() => acceptAll(rx, [chunks[0]!, { ...chunks[2]!, index: 1 }, { ...chunks[1]!, index: 2 }]))).toBe(Code.InvalidArgument);
    expect(snapshot(D, rx)).toEqual(before);
    P.releaseAll(pre.ids);
    P.releaseAll(long.ids);
  } finally {
    rx.close();
  }
});

test("import zeroes slots past the fill", () => {
  // D's blocks are reused without zeroing on import: a tail whose envelope carries
  // bytes past its fill (a writer that did not zero them) must still land zero there,
  // and a reused block must not keep its previous contents.
  const P = new KvPool(SHAPE, 8);
  const D = new KvPool(SHAPE, 2);
  const rx = new KvReceiver(D, { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
  try {
    D.bytes.fill(0x5a); // stale contents in every D block
    const pre = fakePrefill(P, fakePrompt(6, 9))!; // one full block + a tail of 2
    const tail = pre.ids[1]!;
    const slot = SHAPE.nKvHeads * SHAPE.headDim * 2;
    const section = SHAPE.blockTokens * slot;
    const payload = P.payload(tail);
    const live = payload.slice();
    for (let s = 0; s < 2 * SHAPE.nLayers; s++) payload.fill(0x77, s * section + 2 * slot, (s + 1) * section);
    const chunks = buildChunks(P, "t", pre.ids, pre.hashes, [false]);
    // writeEnvelope zeroes past the fill itself: put the garbage back into the envelope and reseal it
    const env = chunks[1]!.envelope;
    for (let s = 0; s < 2 * SHAPE.nLayers; s++) env.fill(0x77, 40 + s * section + 2 * slot, 40 + (s + 1) * section);
    const n = env.length;
    const c = crc32c(env.subarray(0, n - 4));
    env.set([c & 0xff, (c >>> 8) & 0xff, (c >>> 16) & 0xff, c >>> 24], n - 4);
    chunks[1]!.crc32c = crc32c(env);
    acceptAll(rx, chunks);
    const got = rx.claim("t")!;
    expect(D.payload(got.blockIds[0]!)).toEqual(P.payload(pre.ids[0]!));
    const want = live.slice();
    for (let s = 0; s < 2 * SHAPE.nLayers; s++) want.fill(0, s * section + 2 * slot, (s + 1) * section);
    expect(D.payload(got.blockIds[1]!)).toEqual(want);
    expect(D.fillOf(got.blockIds[1]!)).toBe(2);
    D.releaseAll(got.blockIds);
  } finally {
    rx.close();
  }
});
