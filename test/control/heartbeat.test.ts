import { expect, test } from "bun:test";
import { Heartbeat, KvEventFeed, beatOnce, newBeatState, workerStatus, type WorkerIdentity, type WorkerLoad } from "../../src/control/index.ts";
import { KvEventLog, KvPool } from "../../src/pool/index.ts";
import { FakeRegistry, eventually, sleep } from "./fake-registry.ts";

const identity: WorkerIdentity = {
  workerId: "w1",
  httpAddress: "127.0.0.1:8001",
  grpcAddress: "127.0.0.1:9001",
  kvAddress: "127.0.0.1:9101",
  role: "both",
  model: "m",
  blockTokens: 16,
  totalBlocks: 64,
};
const idle: WorkerLoad = { queueDepth: 0, running: 0, freeBlocks: 64, draining: false };
const status = workerStatus(identity, idle, 1n);

test("beat once counts failures and drain", async () => {
  const registry = new FakeRegistry();
  const state = newBeatState(2000);

  registry.mode = "fail";
  expect(await beatOnce(registry, status, 1000, state)).toBe(false);
  expect(await beatOnce(registry, status, 1000, state)).toBe(false);
  expect(state.failures).toBe(2);

  registry.mode = "ok";
  expect(await beatOnce(registry, status, 1000, state)).toBe(true);
  expect(state.failures).toBe(0);
  expect(state.drainRequested).toBe(false);
  expect(state.intervalMs).toBe(2000);

  // A registry that never answers costs one timeout, not the loop.
  registry.mode = "hang";
  const t0 = performance.now();
  expect(await beatOnce(registry, status, 100, state)).toBe(false);
  const took = performance.now() - t0;
  expect(took).toBeGreaterThanOrEqual(90);
  expect(took).toBeLessThan(10_000); // one timeout, not a hang: generous for a loaded machine
  expect(state.failures).toBe(1);
  expect(registry.signals.at(-1)!.aborted).toBe(true);

  // Drain is sticky; interval_ms 0 keeps the interval, > 0 replaces it.
  registry.mode = "ok";
  registry.acks = [
    { drain: true, intervalMs: 0 },
    { drain: false, intervalMs: 500 },
    { drain: false, intervalMs: 0 },
  ];
  expect(await beatOnce(registry, status, 1000, state)).toBe(true);
  expect(state.failures).toBe(0);
  expect(state.drainRequested).toBe(true);
  expect(state.intervalMs).toBe(2000);
  await beatOnce(registry, status, 1000, state);
  expect(state.drainRequested).toBe(true);
  expect(state.intervalMs).toBe(500);
  await beatOnce(registry, status, 1000, state);
  expect(state.drainRequested).toBe(true);
  expect(state.intervalMs).toBe(500);

  // A failure after a drain request forgets neither.
  registry.mode = "fail";
  await beatOnce(registry, status, 1000, state);
  expect(state).toMatchObject({ failures: 1, drainRequested: true, intervalMs: 500 });
});

test("heartbeat beats on schedule", async () => {
  // At once: with a 10 s interval, a beat seen at all is the immediate one.
  {
    const registry = new FakeRegistry();
    const hb = Heartbeat.spawn(registry, identity, () => idle, 10_000, 1000);
    expect(await eventually(() => registry.beats.length === 1)).toBe(true);
    await sleep(100);
    expect(registry.beats.length).toBe(1);
    await hb.stop();
  }

  // Every interval, with a fresh load each beat, through failures too.
  {
    const registry = new FakeRegistry();
    let n = 0;
    const hb = Heartbeat.spawn(registry, identity, () => ({ ...idle, running: ++n }), 50, 1000);
    await sleep(300);
    registry.mode = "fail";
    await sleep(300);
    registry.mode = "ok";
    await sleep(200);
    await hb.stop();
    const beats = registry.beats;
    // ~16 expected; loose bounds keep a loaded machine from failing the test.
    expect(beats.length).toBeGreaterThanOrEqual(6);
    expect(beats.length).toBeLessThanOrEqual(20);
    expect(beats.map((b) => b.status.running)).toEqual(beats.map((_, i) => i + 1));
    expect(beats.map((b) => b.status.seq)).toEqual(beats.map((_, i) => BigInt(i + 1)));
    expect(hb.state.failures).toBe(0);
    const gaps = beats.slice(1).map((b, i) => b.atMs - beats[i]!.atMs);
    expect(Math.min(...gaps)).toBeGreaterThanOrEqual(30);
  }

  // The registry's interval_ms wins; a drain ack fires onDrain once and is reported thereafter.
  {
    const registry = new FakeRegistry();
    registry.acks = [{ intervalMs: 1000 }];
    let drains = 0;
    const hb = Heartbeat.spawn(
      registry,
      identity,
      () => idle,
      20,
      1000,
      () => drains++,
    );
    await sleep(300);
    // 20 ms would have given ~15 beats; the ack stretched it to 1 s.
    expect(registry.beats.length).toBe(1);
    expect(hb.state.intervalMs).toBe(1000);
    registry.acks = [{ intervalMs: 30, drain: true }];
    expect(await eventually(() => registry.beats.length >= 4)).toBe(true);
    await hb.stop();
    expect(drains).toBe(1);
    expect(hb.state.drainRequested).toBe(true);
    const draining = registry.beats.map((b) => b.status.draining);
    expect(draining[0]).toBe(false);
    expect(draining.slice(2).every((d) => d)).toBe(true);
  }

  // stop() is prompt even while a beat hangs, and cancels that beat.
  {
    const registry = new FakeRegistry();
    registry.mode = "hang";
    const hb = Heartbeat.spawn(registry, identity, () => idle, 50, 10_000);
    expect(await eventually(() => registry.beats.length === 1)).toBe(true);
    const t0 = performance.now();
    await hb.stop();
    // Well inside the hanging beat's 10 s timeout, which stop() must not wait for.
    expect(performance.now() - t0).toBeLessThan(5_000);
    expect(registry.signals[0]!.aborted).toBe(true);
    expect(hb.state.failures).toBe(0);
    await sleep(100);
    expect(registry.beats.length).toBe(1);
  }
});

test("beat now cuts the wait short", async () => {
  const { Heartbeat } = await import("../../src/control/index.ts");
  const seen: number[] = [];
  const registry = {
    heartbeat: async () => {
      seen.push(performance.now());
      return { drain: false, intervalMs: 0 } as never;
    },
  };
  const identity = {
    workerId: "w",
    httpAddress: "h:1",
    grpcAddress: "g:1",
    kvAddress: "",
    role: "prefill" as const,
    model: "m",
    blockTokens: 4,
    totalBlocks: 8,
  };
  const hb = Heartbeat.spawn(registry, identity, () => ({ queueDepth: 0, running: 0, freeBlocks: 8, draining: false }), 10_000, 500);
  try {
    while (seen.length < 1) await Bun.sleep(5);
    await Bun.sleep(20);
    expect(seen.length).toBe(1); // the next scheduled beat is 10 s away
    hb.beatNow();
    const t = performance.now();
    while (seen.length < 2 && performance.now() - t < 1000) await Bun.sleep(5);
    expect(seen.length).toBe(2);
  } finally {
    await hb.stop();
  }
});

test("beats carry KV events to a gateway that names itself, none to one that predates them; its absence (not its slowness) is told once", async () => {
  const pool = new KvPool({ blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 }, 8);
  const log = KvEventLog.watching(pool);
  const gone: string[] = [];
  const run = async (gatewayId: string) => {
    const reg = new FakeRegistry();
    reg.fallback = { gatewayId };
    const hb = Heartbeat.spawn(reg, identity, () => idle, 20, 100, undefined, {
      events: new KvEventFeed({ log, named: () => pool.namedHashes() }),
      onGatewayGone: (id) => gone.push(id),
    });
    expect(await eventually(() => reg.beats.length >= 3)).toBe(true);
    return { reg, hb };
  };
  const modern = await run("gateway-a.1");
  expect(modern.reg.beats.every((b) => b.status.kvEvents !== undefined)).toBe(true);
  // A replica that stops answering in time is slow, not gone: it keeps its handles.
  modern.reg.mode = "hang";
  expect(await eventually(() => modern.hb.state.failures >= 4)).toBe(true);
  expect(gone).toEqual([]);
  // Nothing listens at its address from now on: after 3 refusals in a row it is gone, and said so once.
  modern.reg.mode = "fail";
  expect(await eventually(() => modern.hb.state.unreachable >= 5)).toBe(true);
  await modern.hb.stop();
  expect(gone).toEqual(["gateway-a.1"]);
  const old = await run("");
  expect(old.reg.beats[0]!.status.kvEvents).toBeDefined();
  expect(old.reg.beats.slice(1).every((b) => b.status.kvEvents === undefined)).toBe(true);
  await old.hb.stop();
});
