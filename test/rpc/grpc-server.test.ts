import { expect, test } from "bun:test";
import * as net from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { closeGrpcClients, grpcClient, serveGrpc } from "../../src/rpc/index.ts";
import { HeartbeatAckSchema, WorkerRegistry } from "../../src/gen/tl/control/v1/control_pb.ts";
import { codeOf } from "../control/fake-registry.ts";

test("serve grpc close is prompt", async () => {
  let sawAbort = false;
  const server = await serveGrpc((router) =>
    router.service(WorkerRegistry, {
      heartbeat: async (status, ctx) => {
        if (status.workerId === "hang") {
          await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
          sawAbort = true;
        }
        return create(HeartbeatAckSchema, { intervalMs: 7 });
      },
      listWorkers: () => ({ workers: [] }),
    }),
  );
  const client = grpcClient(WorkerRegistry, server.address);
  expect((await client.heartbeat({ workerId: "w" })).intervalMs).toBe(7);

  // A pooled idle connection plus a call in flight: close() must not wait on either.
  const inFlight = codeOf(client.heartbeat({ workerId: "hang" }));
  await new Promise((r) => setTimeout(r, 50));
  const t0 = performance.now();
  await server.close();
  // The call in flight would hang for ever: any bound shows close() did not wait for it.
  expect(performance.now() - t0).toBeLessThan(5_000);
  expect(await inFlight).toBe(Code.Unavailable);
  expect(sawAbort).toBe(true);
  await server.close(); // idempotent

  // The port is free again and the cached channel redials a new server there.
  const again = await serveGrpc(
    (router) =>
      router.service(WorkerRegistry, {
        heartbeat: () => create(HeartbeatAckSchema, { intervalMs: 9 }),
        listWorkers: () => ({ workers: [] }),
      }),
    { port: server.port },
  );
  try {
    expect(again.address).toBe(server.address);
    expect((await client.heartbeat({ workerId: "w" })).intervalMs).toBe(9);
    // The port is taken now.
    await expect(serveGrpc(() => {}, { port: again.port })).rejects.toThrow();
  } finally {
    await again.close();
  }
});

test("grpc client shares connection and fails fast", async () => {
  const server = await serveGrpc(
    (router) =>
      router.service(WorkerRegistry, {
        heartbeat: async (s, ctx) => {
          if (s.model === "hang") await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
          return create(HeartbeatAckSchema, { intervalMs: s.model.length });
        },
        listWorkers: () => ({ workers: [] }),
      }),
    { maxMessageBytes: 1024 },
  );
  // Count TCP connections through a pass-through proxy in front of the server.
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((inbound) => {
    connections++;
    const outbound = net.connect(server.port, "127.0.0.1");
    for (const s of [inbound, outbound]) {
      sockets.add(s);
      s.on("error", () => {});
    }
    inbound.pipe(outbound).pipe(inbound);
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  const target = `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
  try {
    const a = grpcClient(WorkerRegistry, target);
    const b = grpcClient(WorkerRegistry, target, { timeoutMs: 1000 });
    expect((await a.heartbeat({ model: "abc" })).intervalMs).toBe(3);
    await Promise.all([b.heartbeat({ model: "x" }), a.listWorkers({}), b.listWorkers({})]);
    expect(connections).toBe(1);

    expect(await codeOf(a.heartbeat({ model: "m".repeat(4096) }))).toBe(Code.ResourceExhausted);

    closeGrpcClients(target);
    const c = grpcClient(WorkerRegistry, target);
    expect((await c.heartbeat({ model: "abcd" })).intervalMs).toBe(4);
    expect(connections).toBe(2);

    // The connection dropping under a call without a deadline fails it at once, not never.
    const dropped = codeOf(c.heartbeat({ model: "hang" }));
    await new Promise((r) => setTimeout(r, 50));
    const t0 = performance.now();
    for (const s of sockets) s.destroy();
    expect(await dropped).toBe(Code.Canceled); // connect-node reports the reset stream as cancelled
    expect(performance.now() - t0).toBeLessThan(5_000);
  } finally {
    closeGrpcClients(target);
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => proxy.close(() => r()));
    await server.close();
  }
});

test("peer check refuses before the handler", async () => {
  const seen: { method: string; remoteAddress: string; tls: boolean }[] = [];
  let listed = 0;
  const server = await serveGrpc(
    (router) =>
      router.service(WorkerRegistry, {
        heartbeat: () => create(HeartbeatAckSchema, { intervalMs: 3 }),
        listWorkers: () => {
          listed++;
          return { workers: [] };
        },
      }),
    {
      peerCheck: (call) => {
        seen.push({ method: call.method, remoteAddress: call.remoteAddress, tls: call.tls !== undefined });
        if (call.method.endsWith("/ListWorkers")) throw new ConnectError(`caller ${call.remoteAddress} may not call ${call.method}`, Code.PermissionDenied);
      },
    },
  );
  try {
    const client = grpcClient(WorkerRegistry, server.address);
    expect((await client.heartbeat({ workerId: "w" })).intervalMs).toBe(3);
    const err = await client.listWorkers({}).then(
      () => null,
      (e: unknown) => ConnectError.from(e),
    );
    expect([err?.code, err?.rawMessage]).toEqual([Code.PermissionDenied, "caller 127.0.0.1 may not call /tl.control.v1.WorkerRegistry/ListWorkers"]);
    expect(listed).toBe(0);
    expect(seen.map((s) => s.method)).toEqual(["/tl.control.v1.WorkerRegistry/Heartbeat", "/tl.control.v1.WorkerRegistry/ListWorkers"]);
    expect(seen.every((s) => s.remoteAddress === "127.0.0.1" && !s.tls)).toBe(true);
  } finally {
    closeGrpcClients(server.address);
    await server.close();
  }
});
