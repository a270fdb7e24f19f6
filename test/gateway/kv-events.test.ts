import { expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type HandlerContext } from "@connectrpc/connect";
import { promptHashes } from "../../src/codec/index.ts";
import { KvEventFeed } from "../../src/control/index.ts";
import { InFlight, PairPicker, PrefixIndex, RegistryService, WorkerRegistry } from "../../src/gateway/index.ts";
import { KvEventsSchema, KvEventSchema, Role, WorkerStatusSchema, type HeartbeatAck, type KvEvents } from "../../src/gen/tl/control/v1/control_pb.ts";
import { KvEventLog, KvPool } from "../../src/pool/index.ts";
import { callerKey } from "../../src/rpc/peer-gate.ts";
import type { PeerIdentity } from "../../src/rpc/peer-identity.ts";

// A gateway's prefix index fed only by engines' KV events (docs/grpc-services.md, "KV events"):
// the engine side is a real pool with its event log and one feed per gateway.

const B = 4;
const shape = { blockTokens: B, nLayers: 1, nKvHeads: 1, headDim: 2 };
const prompt = Array.from({ length: 10 * B }, (_, i) => (i * 7 + 3) % 250);
const hashes = promptHashes(prompt, B);

/** One decode engine: its pool, its event log, and its cursor toward one gateway. */
function engine(workerId: string, blocks = 64, logCapacity = 1024) {
  const pool = new KvPool(shape, blocks);
  const log = new KvEventLog(logCapacity);
  pool.watch(log);
  const feed = new KvEventFeed({ log, named: () => pool.namedHashes() });
  return { workerId, pool, log, feed };
}
type Engine = ReturnType<typeof engine>;

/** What a push of `hs` leaves on D once claimed and finished: named, cached blocks. */
function hold(e: Engine, hs: readonly bigint[]): void {
  const ids = e.pool.allocate(hs.length)!;
  hs.forEach((h, i) => e.pool.register(ids[i]!, h));
  e.pool.releaseAll(ids);
}

/** Takes every block of the pool: each cached block is evicted, and said so. */
function evictAll(e: Engine): void {
  e.pool.releaseAll(e.pool.allocate(e.pool.total)!);
}

const asPeer = (peer: PeerIdentity) => ({ values: createContextValues().set(callerKey, peer) }) as unknown as HandlerContext;

function gateway() {
  const registry = new WorkerRegistry({ intervalMs: 1000 });
  const index = new PrefixIndex({ maxBlocks: 1 << 20 });
  const svc = new RegistryService(registry, { maxWorkers: 256, index, gatewayId: "gateway-a.00000001" });
  const picker = new PairPicker(registry, index, new InFlight(), { overlap: 1, load: 8 });
  const status = (workerId: string, role: Role, kvEvents?: KvEvents) =>
    create(WorkerStatusSchema, { workerId, role, kvFormat: 1, seq: 1n, blockTokens: B, freeBlocks: 64, totalBlocks: 64, ...(kvEvents ? { kvEvents } : {}) });
  /** One beat of `e` carrying its feed's next batch, as an engine whose certificate is `peer`. */
  const beat = async (e: Engine, peer: PeerIdentity = { role: "decode", workerId: e.workerId }): Promise<HeartbeatAck> => {
    const ack = await svc.impl.heartbeat!(status(e.workerId, Role.DECODE, e.feed.batch()), asPeer(peer));
    e.feed.acked(ack as HeartbeatAck);
    return ack as HeartbeatAck;
  };
  const decodeFor = () => {
    const pair = picker.pair(prompt, new Set())!;
    pair.releasePrefill();
    pair.releaseDecode();
    return pair.decode.worker.status.workerId;
  };
  return {
    registry,
    index,
    svc,
    status,
    beat,
    decodeFor,
    prefill: () => svc.impl.heartbeat!(status("p", Role.PREFILL), asPeer({ role: "prefill", workerId: "p" })),
  };
}

test("a gateway that only receives events routes a prompt to the engine holding its prefix; an eviction event stops that", async () => {
  const g = gateway();
  try {
    const [d0, d1] = [engine("d0"), engine("d1")];
    await g.prefill();
    await g.beat(d0);
    await g.beat(d1);
    // Nobody holds anything: the tie goes to d0 (worker id).
    expect(g.decodeFor()).toBe("d0");
    // d1 holds the prompt's blocks (another replica routed them there): its next beat says so.
    hold(d1, hashes);
    const ack = await g.beat(d1);
    expect(ack).toMatchObject({ kvSnapshot: false, gatewayId: "gateway-a.00000001" });
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);
    expect(g.decodeFor()).toBe("d1");
    // d1 evicts them: its next beat says so, and the prompt no longer leans on d1.
    evictAll(d1);
    await g.beat(d1);
    expect(g.index.leadingHits("d1", hashes)).toBe(0);
    expect(g.decodeFor()).toBe("d0");
  } finally {
    g.svc.close();
  }
});

test("a gap in sequence numbers makes the gateway ask for a snapshot, which restores the index", async () => {
  const g = gateway();
  try {
    const d1 = engine("d1");
    await g.beat(d1);
    hold(d1, hashes.slice(0, 4));
    // Events 1..4 are in the log; a beat claiming to start at 7 skips 5 and 6.
    const skipped = create(KvEventsSchema, { firstSeq: d1.log.nextSeq + 2n, epoch: d1.log.epoch, events: [create(KvEventSchema, { hashes: [hashes[5]!] })] });
    const ack = (await g.svc.impl.heartbeat!(g.status("d1", Role.DECODE, skipped), asPeer({ role: "decode", workerId: "d1" }))) as HeartbeatAck;
    expect(ack.kvSnapshot).toBe(true);
    expect(g.index.leadingHits("d1", hashes)).toBe(0); // nothing of the batch past the gap was applied
    d1.feed.acked(ack);
    // The feed answers with a snapshot of what the pool names: the index holds exactly that.
    const snap = d1.feed.batch();
    expect(snap.snapshot).toBe(true);
    d1.feed.acked((await g.svc.impl.heartbeat!(g.status("d1", Role.DECODE, snap), asPeer({ role: "decode", workerId: "d1" }))) as HeartbeatAck);
    expect(g.index.leadingHits("d1", hashes)).toBe(4);
    // Back in step: later events apply again.
    hold(d1, hashes.slice(4));
    expect((await g.beat(d1)).kvSnapshot).toBe(false);
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);
  } finally {
    g.svc.close();
  }
});

test("an engine whose log no longer holds a gateway's cursor sends a snapshot in bounded pieces", async () => {
  const g = gateway();
  try {
    const d1 = engine("d1", 64, 8);
    await g.beat(d1);
    hold(d1, hashes); // 10 events into a ring of 8: the cursor (1) fell out
    const next = d1.feed.batch();
    expect(next).toMatchObject({ snapshot: true, snapshotIndex: 0 });
    d1.feed.acked((await g.svc.impl.heartbeat!(g.status("d1", Role.DECODE, next), asPeer({ role: "decode", workerId: "d1" }))) as HeartbeatAck);
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);

    // A snapshot bigger than one beat travels in pieces, each within the bound.
    const big = engine("d2", 64);
    const small = new KvEventFeed({ log: big.log, named: () => big.pool.namedHashes() }, 3);
    big.feed = small;
    hold(big, hashes);
    const pieces: number[] = [];
    for (let i = 0; i < 10; i++) {
      const b = small.batch();
      if (!b.snapshot) break;
      pieces.push(b.events[0]!.hashes.length);
      small.acked((await g.svc.impl.heartbeat!(g.status("d2", Role.DECODE, b), asPeer({ role: "decode", workerId: "d2" }))) as HeartbeatAck);
    }
    expect(pieces).toEqual([3, 3, 3, 1]);
    expect(g.index.leadingHits("d2", hashes)).toBe(hashes.length);
  } finally {
    g.svc.close();
  }
});

test("an engine cannot report blocks for another worker id", async () => {
  const g = gateway();
  try {
    const [d1, d2] = [engine("d1"), engine("d2")];
    hold(d2, hashes);
    // d1's certificate beating d2's status, events and all: refused, and nothing applied.
    const err = await g.beat(d2, { role: "decode", workerId: "d1" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.PermissionDenied);
    expect(g.index.leadingHits("d2", hashes)).toBe(0);
    expect(g.registry.list()).toEqual([]);
    // Its own beat is taken.
    hold(d1, hashes);
    await g.beat(d1);
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);
  } finally {
    g.svc.close();
  }
});

test("a beat with more event hashes than the bound is refused before any is applied", async () => {
  const g = gateway();
  try {
    const fat = create(KvEventsSchema, {
      snapshot: true,
      epoch: 1n,
      events: [create(KvEventSchema, { hashes: Array.from({ length: 4097 }, (_, i) => BigInt(i + 1)) })],
    });
    const err = await (async () => g.svc.impl.heartbeat!(g.status("d1", Role.DECODE, fat), asPeer({ role: "decode", workerId: "d1" })))().catch(
      (e: unknown) => e,
    );
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect(g.index.size).toBe(0);
  } finally {
    g.svc.close();
  }
});

test("the index is bounded: beyond maxBlocks the least recently reported go, whichever engine reported them", () => {
  const index = new PrefixIndex({ maxBlocks: 6 });
  const snap = (hs: bigint[]) =>
    create(KvEventsSchema, { snapshot: true, snapshotLast: true, firstSeq: 1n, epoch: 7n, events: [create(KvEventSchema, { hashes: hs })] });
  index.apply("a", snap([1n << 20n, 2n << 20n, 3n << 20n, 4n << 20n]));
  index.apply("b", snap([5n << 20n, 6n << 20n, 7n << 20n]));
  expect(index.size).toBe(6);
  // a's first block went: a's later ones and all of b's stay.
  expect(index.leadingHits("a", [1n << 20n])).toBe(0);
  expect(index.leadingHits("a", [2n << 20n, 3n << 20n, 4n << 20n])).toBe(3);
  expect(index.leadingHits("b", [5n << 20n, 6n << 20n, 7n << 20n])).toBe(3);
  // Re-reporting makes a block recent again: a's 2 survives the next overflow, a's 3 does not.
  index.apply("a", create(KvEventsSchema, { firstSeq: 1n, epoch: 7n, events: [create(KvEventSchema, { hashes: [2n << 20n, 8n << 20n] })] }));
  expect(index.leadingHits("a", [2n << 20n])).toBe(1);
  expect(index.leadingHits("a", [3n << 20n])).toBe(0);
  expect(index.size).toBe(6);
});

test("the gateway's own routing decisions fill the gap until the engine's second caught-up beat", async () => {
  const g = gateway();
  try {
    const d1 = engine("d1");
    await g.beat(d1);
    g.index.record("d1", hashes);
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);
    await g.beat(d1); // may have left D before the push landed: the decision stands
    expect(g.index.leadingHits("d1", hashes)).toBe(hashes.length);
    await g.beat(d1); // D never said it holds them: they are gone from the index
    expect(g.index.leadingHits("d1", hashes)).toBe(0);
  } finally {
    g.svc.close();
  }
});
