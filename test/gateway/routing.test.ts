import { expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { promptHashes } from "../../src/codec/index.ts";
import { InFlight, loadOf, PrefixIndex, PairPicker, RetryPolicy, Suspects, WorkerRegistry } from "../../src/gateway/index.ts";
import { Role, WorkerStatusSchema, type WorkerStatus } from "../../src/gen/tl/control/v1/control_pb.ts";
import { FAILED_SIDE_HEADER } from "../../src/handoff/index.ts";
import { Code } from "../../src/rpc/status.ts";

/** route_overlap_weight and route_load_weight as [gateway] has them by default. */
const WEIGHTS = { overlap: 1, load: 8 };

const B = 4;
const beat = (workerId: string, role: Role, extra: Partial<Omit<WorkerStatus, "$typeName" | "$unknown">> = {}) =>
  create(WorkerStatusSchema, { workerId, role, kvFormat: 1, seq: 1n, blockTokens: B, freeBlocks: 100, totalBlocks: 100, ...extra });

function cluster(now: () => number = Date.now) {
  const registry = new WorkerRegistry({ intervalMs: 1000, now });
  registry.beat(beat("p", Role.PREFILL));
  registry.beat(beat("d0", Role.DECODE));
  registry.beat(beat("d1", Role.DECODE));
  return registry;
}

const prompt = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => (i * 7 + salt) % 250);

test("a burst reserves at the decision: 100 concurrent picks over 2 decode engines split 50/50, and every release returns the count to 0", () => {
  const inflight = new InFlight();
  const picker = new PairPicker(cluster(), new PrefixIndex({ maxBlocks: 1 << 20 }), inflight, WEIGHTS);
  const pairs = Array.from({ length: 100 }, (_, i) => picker.pair(prompt(40, i), new Set())!);
  const on = (id: string) => pairs.filter((p) => p.decode.worker.status.workerId === id).length;
  expect([on("d0"), on("d1")]).toEqual([50, 50]);
  expect(inflight.byWorker.get("p")).toBe(100);
  for (const p of pairs) {
    p.releasePrefill();
    p.releaseDecode();
    p.releaseDecode(); // a release runs at most once
  }
  expect([...inflight.byWorker.values()]).toEqual([0, 0, 0]);
});

test("the cost weighs cached blocks against load: the affine engine running 4 loses to the idle one under the default weights, wins when overlap weighs more", () => {
  const registry = cluster();
  registry.beat(beat("d0", Role.DECODE, { running: 4 }));
  const affinity = new PrefixIndex({ maxBlocks: 1 << 20 });
  const tokens = prompt(64); // 16 full blocks, all believed on d0
  affinity.record("d0", promptHashes(tokens, B));
  // Defaults (overlap 1, load 8): d0 costs 0 + 8×4 = 32, d1 costs 16 + 0.
  const balanced = new PairPicker(registry, affinity, new InFlight(), WEIGHTS).pair(tokens, new Set())!;
  expect(balanced.decode.worker.status.workerId).toBe("d1");
  expect(balanced.decode.why).toMatch(/lowest cost 16 .*holds 0 of 16/);
  // Overlap 4: d0 costs 32, d1 costs 64.
  const affine = new PairPicker(registry, affinity, new InFlight(), { overlap: 4, load: 8 }).pair(tokens, new Set())!;
  expect(affine.decode.worker.status.workerId).toBe("d0");
  expect(affine.decode.hits).toBe(16);
  // Equal load: the cached prefix decides.
  registry.beat(beat("d0", Role.DECODE, { running: 0 }));
  expect(new PairPicker(registry, affinity, new InFlight(), WEIGHTS).pair(tokens, new Set())!.decode.worker.status.workerId).toBe("d0");
});

test("affinity never piles a burst of one shared prefix onto the affine engine", () => {
  const affinity = new PrefixIndex({ maxBlocks: 1 << 20 });
  const tokens = prompt(64);
  affinity.record("d0", promptHashes(tokens, B));
  const picker = new PairPicker(cluster(), affinity, new InFlight(), WEIGHTS);
  const picks = Array.from({ length: 100 }, () => picker.pair(tokens, new Set())!.decode.worker.status.workerId);
  const d0 = picks.filter((x) => x === "d0").length;
  // 16 blocks of overlap are worth 2 requests of load: d0 leads by at most 2.
  expect(d0).toBeGreaterThanOrEqual(50);
  expect(d0).toBeLessThanOrEqual(52);
});

test("a suspect is scored out for its cool-down, a worker a beat late at once; when all are suspect they are used anyway", () => {
  let now = 1_000_000;
  const registry = cluster(() => now);
  const suspects = new Suspects(5000, () => now);
  const picker = new PairPicker(registry, new PrefixIndex({ maxBlocks: 1 << 20 }), new InFlight(), WEIGHTS, suspects);
  const decodeOf = () => {
    const p = picker.pair(prompt(8), new Set())!;
    p.releasePrefill();
    p.releaseDecode();
    return p.decode.worker.status.workerId;
  };
  expect(decodeOf()).toBe("d0");
  suspects.mark("d0");
  expect(decodeOf()).toBe("d1");
  suspects.mark("d1");
  expect(["d0", "d1"]).toContain(decodeOf());
  now += 5001;
  for (const [id, role] of [
    ["p", Role.PREFILL],
    ["d0", Role.DECODE],
    ["d1", Role.DECODE],
  ] as const)
    registry.beat(beat(id, role));
  expect(decodeOf()).toBe("d0");
  // d0 stops beating: a whole interval late, it is routed around before eviction (3 intervals).
  now += 1200;
  registry.beat(beat("p", Role.PREFILL));
  registry.beat(beat("d1", Role.DECODE));
  expect(registry.live().map((w) => w.status.workerId)).toEqual(["d0", "d1", "p"]);
  expect(decodeOf()).toBe("d1");
});

test("retry policy: a deadline P never explained makes both engines suspect and excludes neither; a named side is blamed alone", () => {
  const own = new RetryPolicy().decide(new ConnectError("deadline", Code.DeadlineExceeded), "p", "d0");
  expect(own).toEqual({ again: true, exclude: null, why: expect.any(String), suspect: ["p", "d0"] });
  const named = new RetryPolicy().decide(new ConnectError("push timed out", Code.DeadlineExceeded, new Headers({ [FAILED_SIDE_HEADER]: "decode" })), "p", "d0");
  expect(named).toEqual({ again: true, exclude: "d0", why: expect.any(String), suspect: ["d0"] });
  expect(new RetryPolicy().decide(new ConnectError("bad", Code.InvalidArgument), "p", "d0")).toEqual({ again: false, suspect: [] });
});

test("[gateway] routing keys: weights take decimals ≥ 0, the disaggregation threshold takes 0, anything else is refused by name", async () => {
  const { parseArgs, ConfigError } = await import("../../src/cli/options.ts");
  const g = parseArgs(["--role", "gateway", "--route-overlap-weight", "0.5", "--route-load-weight", "12", "--disagg-min-uncached-tokens", "0"]).config.gateway;
  expect([g.route_overlap_weight, g.route_load_weight, g.disagg_min_uncached_tokens]).toEqual([0.5, 12, 0]);
  expect(parseArgs(["--role", "gateway"]).config.gateway.disagg_min_uncached_tokens).toBe(512);
  expect(() => parseArgs(["--role", "gateway", "--route-load-weight", "-1"])).toThrow(ConfigError);
  expect(() => parseArgs(["--role", "gateway", "--disagg-min-uncached-tokens", "1.5"])).toThrow(/disagg_min_uncached_tokens: want an integer ≥ 0/);
  expect(() => parseArgs(["--role", "gateway", "--prefill-timeout-ms", "0"])).toThrow(/prefill_timeout_ms: want a positive integer/);
});

test("load is what a worker reports plus this replica's reservations its report cannot include yet", () => {
  let now = 1_000_000;
  const registry = new WorkerRegistry({ intervalMs: 1000, now: () => now });
  const inflight = new InFlight(() => now);
  registry.beat(beat("d0", Role.DECODE, { running: 3 })); // every replica's work, as of now
  registry.beat(beat("d1", Role.DECODE, { running: 0 }));
  now += 10;
  const r1 = inflight.reserve("d1");
  const r2 = inflight.reserve("d1");
  const r0 = inflight.reserve("d0"); // on top of another replica's 3
  const load = () => new Map(registry.live().map((w) => [w.status.workerId, loadOf(w, inflight.unreported(registry.live()))]));
  // d1's two came after its beat: counted on top of what it reported.
  expect(load()).toEqual(
    new Map([
      ["d0", 4],
      ["d1", 2],
    ]),
  );
  // d1's next beat reports them: they count there once, not twice.
  now += 10;
  registry.beat(beat("d1", Role.DECODE, { running: 2 }));
  expect(load()).toEqual(
    new Map([
      ["d0", 4],
      ["d1", 2],
    ]),
  );
  r0();
  now += 10;
  r1();
  r2();
  // d1's two were in its last report and are done now: it is idle, not busy until its next beat
  // (the quick start's second request went to the other decode engine for that, blocks resent).
  expect(load()).toEqual(
    new Map([
      ["d0", 3],
      ["d1", 0],
    ]),
  );
  // Its next beat says so itself; nothing is taken off twice.
  now += 10;
  registry.beat(beat("d1", Role.DECODE, { running: 0 }));
  registry.beat(beat("d0", Role.DECODE, { running: 3 }));
  expect(inflight.unreported(registry.live())).toEqual(new Map());
  expect(load()).toEqual(
    new Map([
      ["d0", 3],
      ["d1", 0],
    ]),
  );
});
