import { expect, test } from "bun:test";
import * as net from "node:net";
import { Code } from "@connectrpc/connect";
import { GrpcRegistry, Heartbeat, beatOnce, newBeatState, workerStatus, type WorkerIdentity, type WorkerLoad } from "../../src/control/index.ts";
import { RegistryService, WorkerRegistry } from "../../src/gateway/index.ts";
import { serveGrpc } from "../../src/rpc/index.ts";
import { Role } from "../../src/gen/tl/control/v1/control_pb.ts";
import { codeOf, eventually } from "./fake-registry.ts";

const decode: WorkerIdentity = {
  workerId: "d1",
  httpAddress: "127.0.0.1:8002",
  grpcAddress: "127.0.0.1:9002",
  kvAddress: "127.0.0.1:9102",
  role: "decode",
  model: "m",
  blockTokens: 16,
  totalBlocks: 256,
};
const load: WorkerLoad = { queueDepth: 4, running: 1, freeBlocks: 200, draining: false };

test("grpc registry roundtrip", async () => {
  // Long enough that a loaded machine (load ~16 with other agents' builds) never takes three
  // intervals between one beat and the next listing: at 60 ms the worker was evicted in between.
  const INTERVAL = 400;
  const registry = new WorkerRegistry({ intervalMs: INTERVAL, evictAfterMissed: 3 });
  const service = new RegistryService(registry, { maxWorkers: 256 });
  const server = await serveGrpc(service.routes);
  try {
    expect(server.address).toBe(`127.0.0.1:${server.port}`);
    const client = new GrpcRegistry(server.address, 1000);

    const ack = await client.heartbeat(workerStatus(decode, load, 1n), 1000);
    expect(ack.drain).toBe(false);
    expect(ack.intervalMs).toBe(INTERVAL);

    const [entry, ...rest] = await client.listWorkers();
    expect(rest).toEqual([]);
    expect(entry!.status).toMatchObject({
      workerId: "d1",
      kvAddress: "127.0.0.1:9102",
      role: Role.DECODE,
      kvFormat: 1,
      queueDepth: 4,
      running: 1,
      freeBlocks: 200,
      totalBlocks: 256,
      blockTokens: 16,
      seq: 1n,
    });
    expect(Math.abs(Number(entry!.lastSeenUnixMs) - Date.now())).toBeLessThan(5000);
    expect(entry!.missed).toBeLessThan(3);

    // A drain the gateway asks for reaches the engine on its next beat.
    expect(registry.requestDrain("d1")).toBe(true);
    const state = newBeatState(2000);
    // Taken before the last accepted beat, so the time since it is at least this long.
    const beforeLastBeat = performance.now();
    expect(await beatOnce(client, workerStatus(decode, load, 2n), 1000, state)).toBe(true);
    expect(state.drainRequested).toBe(true);
    expect(registry.live()).toEqual([]);

    // Validation travels as status codes.
    expect(await codeOf(client.heartbeat(workerStatus({ ...decode, workerId: "" }, load, 1n), 1000))).toBe(Code.InvalidArgument);
    const wrongFormat = workerStatus(decode, load, 3n);
    wrongFormat.kvFormat = 2;
    expect(await codeOf(client.heartbeat(wrongFormat, 1000))).toBe(Code.FailedPrecondition);

    // Silence for 3 intervals evicts; it can never happen sooner.
    expect(await eventually(async () => (await client.listWorkers()).length === 0, 10_000)).toBe(true);
    expect(performance.now() - beforeLastBeat).toBeGreaterThanOrEqual(3 * INTERVAL - 5);

    // A worker that comes back is admitted afresh, the old drain request forgotten.
    const back = await client.heartbeat(workerStatus(decode, load, 1n), 1000);
    expect(back.drain).toBe(false);
    expect((await client.listWorkers()).map((w) => w.status!.workerId)).toEqual(["d1"]);
    expect(registry.live("decode").map((w) => w.status.workerId)).toEqual(["d1"]);
    expect(registry.live("prefill")).toEqual([]);

    // A Heartbeat loop over gRPC follows the registry's interval and keeps the worker listed.
    const hb = Heartbeat.spawn(client, { ...decode, workerId: "d2" }, () => load, 10_000, 1000);
    expect(
      await eventually(async () => {
        const d2 = (await client.listWorkers()).find((w) => w.status!.workerId === "d2");
        return d2 !== undefined && d2.status!.seq >= 4n;
      }, 10_000),
    ).toBe(true);
    expect(hb.state.intervalMs).toBe(INTERVAL);
    expect(hb.state.failures).toBe(0);
    await hb.stop();
  } finally {
    service.close();
    await server.close();
  }

  // The same address, now closed, refuses at once: Unavailable, where a call that waited
  // out its 300 ms would be DeadlineExceeded.
  const refused = new GrpcRegistry(server.address, 300);
  expect(await codeOf(refused.heartbeat(workerStatus(decode, load, 1n), 300))).toBe(Code.Unavailable);
  const state = newBeatState(2000);
  expect(await beatOnce(refused, workerStatus(decode, load, 1n), 300, state)).toBe(false);
  expect(state.failures).toBe(1);
});

test("grpc registry silent peer is bounded", async () => {
  // A peer that accepts TCP and never speaks HTTP/2 is cut by the timeout.
  const status = workerStatus(decode, load, 1n);
  const sockets = new Set<net.Socket>();
  const mute = net.createServer((s) => sockets.add(s));
  await new Promise<void>((r) => mute.listen(0, "127.0.0.1", r));
  const port = (mute.address() as net.AddressInfo).port;
  try {
    const silent = new GrpcRegistry(`127.0.0.1:${port}`, 200);
    let t0 = performance.now();
    const code = await codeOf(silent.heartbeat(status, 200));
    expect(code).toBe(Code.DeadlineExceeded);
    // Bounded, not never: generous for a loaded machine, far below the test's own timeout.
    expect(performance.now() - t0).toBeLessThan(10_000);

    const state = newBeatState(2000);
    t0 = performance.now();
    expect(await beatOnce(silent, status, 200, state)).toBe(false);
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(state.failures).toBe(1);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => mute.close(() => r()));
  }
});
