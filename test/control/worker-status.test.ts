import { expect, test } from "bun:test";
import { Heartbeat, workerStatus, type WorkerIdentity, type WorkerLoad } from "../../src/control/index.ts";
import { Role } from "../../src/gen/tl/control/v1/control_pb.ts";
import { FakeRegistry, eventually } from "./fake-registry.ts";

const identity = (role: WorkerIdentity["role"]): WorkerIdentity => ({
  workerId: `w-${role}`,
  httpAddress: "127.0.0.1:8001",
  grpcAddress: "127.0.0.1:9001",
  kvAddress: "127.0.0.1:9101",
  role,
  model: "stories15M",
  blockTokens: 16,
  totalBlocks: 512,
});
const load: WorkerLoad = { queueDepth: 3, running: 2, freeBlocks: 100, draining: false };

test("worker status fields", async () => {
  const p = workerStatus(identity("prefill"), load, 1n);
  const d = workerStatus(identity("decode"), load, 2n);
  const b = workerStatus(identity("both"), { ...load, draining: true }, 7n);

  expect(p.kvAddress).toBe("");
  expect(d.kvAddress).toBe("127.0.0.1:9101");
  expect(b.kvAddress).toBe("127.0.0.1:9101");
  expect([p.role, d.role, b.role]).toEqual([Role.PREFILL, Role.DECODE, Role.BOTH]);
  for (const s of [p, d, b]) expect(s.kvFormat).toBe(1);
  expect(d).toMatchObject({
    workerId: "w-decode",
    httpAddress: "127.0.0.1:8001",
    grpcAddress: "127.0.0.1:9001",
    model: "stories15M",
    queueDepth: 3,
    running: 2,
    freeBlocks: 100,
    totalBlocks: 512,
    blockTokens: 16,
    draining: false,
    seq: 2n,
  });
  expect(b.draining).toBe(true);
  expect(b.seq).toBe(7n);

  // Each beat samples the load afresh.
  const registry = new FakeRegistry();
  let calls = 0;
  const hb = Heartbeat.spawn(
    registry,
    identity("decode"),
    () => {
      calls++;
      return { queueDepth: calls * 10, running: calls, freeBlocks: 500 - calls, draining: false };
    },
    20,
    1000,
  );
  expect(await eventually(() => registry.beats.length >= 3)).toBe(true);
  await hb.stop();
  const seen = registry.beats.map((b) => b.status);
  expect(calls).toBe(seen.length);
  seen.forEach((s, i) => {
    expect(s.seq).toBe(BigInt(i + 1));
    expect(s.queueDepth).toBe((i + 1) * 10);
    expect(s.running).toBe(i + 1);
    expect(s.freeBlocks).toBe(500 - (i + 1));
  });
});
