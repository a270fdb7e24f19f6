import { expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { RegistryService, WorkerRegistry } from "../../src/gateway/index.ts";
import { ListWorkersRequestSchema, ListWorkersResponseSchema, Role, WorkerStatusSchema, type WorkerStatus } from "../../src/gen/tl/control/v1/control_pb.ts";

const beat = (workerId: string, role: Role, extra: Partial<Omit<WorkerStatus, "$typeName" | "$unknown">> = {}) =>
  create(WorkerStatusSchema, { workerId, role, kvFormat: 1, seq: 1n, ...extra });

test("worker registry evicts and readmits", () => {
  let now = 1_000_000;
  const reg = new WorkerRegistry({ intervalMs: 100, evictAfterMissed: 3, now: () => now });

  expect(reg.beat(beat("a", Role.PREFILL))).toEqual({ drain: false, intervalMs: 100 });
  reg.beat(beat("b", Role.DECODE));
  expect(reg.list().map((w) => [w.status.workerId, w.missed, w.lastSeenUnixMs])).toEqual([
    ["a", 0, 1_000_000],
    ["b", 0, 1_000_000],
  ]);

  now += 250;
  reg.beat(beat("b", Role.DECODE, { seq: 2n }));
  expect(reg.list().map((w) => [w.status.workerId, w.missed])).toEqual([
    ["a", 2],
    ["b", 0],
  ]);
  expect(reg.sweep()).toEqual([]);

  // a's third whole interval of silence: gone from every view, swept or not.
  now += 50;
  expect(reg.list().map((w) => w.status.workerId)).toEqual(["b"]);
  expect(reg.live().map((w) => w.status.workerId)).toEqual(["b"]);
  expect(reg.requestDrain("a")).toBe(false);
  expect(reg.sweep()).toEqual(["a"]);
  expect(reg.sweep()).toEqual([]);

  // b is asked to drain: it keeps hearing so and leaves the live set, but stays listed.
  expect(reg.requestDrain("b")).toBe(true);
  expect(reg.beat(beat("b", Role.DECODE, { seq: 3n })).drain).toBe(true);
  expect(reg.live()).toEqual([]);
  expect(reg.list().map((w) => [w.status.workerId, w.drainRequested, w.status.seq])).toEqual([["b", true, 3n]]);

  // b goes silent past eviction (unswept) and returns: a fresh admission, drain forgotten.
  now += 300;
  expect(reg.list()).toEqual([]);
  expect(reg.beat(beat("b", Role.DECODE, { seq: 1n })).drain).toBe(false);
  expect(reg.live().map((w) => w.status.workerId)).toEqual(["b"]);

  // a comes back after its sweep.
  reg.beat(beat("a", Role.PREFILL));
  expect(reg.list().map((w) => w.status.workerId)).toEqual(["a", "b"]);
});

test("worker registry live by role", () => {
  const reg = new WorkerRegistry({ intervalMs: 2000, now: () => 0 });
  reg.beat(beat("p", Role.PREFILL));
  reg.beat(beat("d", Role.DECODE));
  reg.beat(beat("x", Role.BOTH));
  reg.beat(beat("z", Role.BOTH, { draining: true }));
  const ids = (role?: "prefill" | "decode") => reg.live(role).map((w) => w.status.workerId);
  expect(ids()).toEqual(["d", "p", "x"]);
  expect(ids("prefill")).toEqual(["p", "x"]);
  expect(ids("decode")).toEqual(["d", "x"]);
  expect(reg.list().map((w) => w.status.workerId)).toEqual(["d", "p", "x", "z"]);
  expect(() => new WorkerRegistry({ intervalMs: 0 })).toThrow(RangeError);
});

test("registry service validates", async () => {
  const reg = new WorkerRegistry({ intervalMs: 100, now: () => 5000 });
  const svc = new RegistryService(reg, { maxWorkers: 256 });
  const ctx = {} as HandlerContext;
  const codeOf = async (s: WorkerStatus) => {
    try {
      await svc.impl.heartbeat!(s, ctx);
      return undefined;
    } catch (err) {
      expect(err).toBeInstanceOf(ConnectError);
      return { code: (err as ConnectError).code, message: (err as ConnectError).rawMessage };
    }
  };
  try {
    expect((await codeOf(beat("", Role.DECODE)))?.code).toBe(Code.InvalidArgument);
    expect(await codeOf(beat("w", Role.DECODE, { kvFormat: 2 }))).toEqual({
      code: Code.FailedPrecondition,
      message: "heartbeat from w: kv_format 2, want 1",
    });
    expect((await codeOf(beat("w", Role.UNSPECIFIED)))?.code).toBe(Code.InvalidArgument);
    expect((await codeOf(beat("w", 9 as Role)))?.code).toBe(Code.InvalidArgument);
    expect(reg.list()).toEqual([]);

    const ack = await svc.impl.heartbeat!(beat("w", Role.DECODE), ctx);
    expect(ack).toMatchObject({ drain: false, intervalMs: 100 });
    const listed = create(ListWorkersResponseSchema, await svc.impl.listWorkers!(create(ListWorkersRequestSchema), ctx));
    expect(listed.workers.map((w) => [w.status?.workerId, w.lastSeenUnixMs, w.missed])).toEqual([["w", 5000n, 0]]);
  } finally {
    svc.close();
  }
});
