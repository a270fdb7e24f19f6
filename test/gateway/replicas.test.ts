import { afterAll, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { startEngineNode, type EngineNode, type EngineNodeOptions } from "../../src/cli/engine-node.ts";
import { GrpcRegistry } from "../../src/control/index.ts";
import { startGateway, type Gateway } from "../../src/gateway/index.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { killAll, readSse, spawnProc } from "../cli/procs.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel, GATEWAY_TUNING } from "../support/nodes.ts";

// Several gateway replicas over one set of engines (issue 28): each keeps its own registry
// and prefix index from the engines' beats, and one that dies costs only its own streams
// and handles.

afterAll(killAll);

const INTERVAL_MS = 100;
const prompt = (salt: number) => `${"You are a careful assistant who answers briefly. ".repeat(3)}Question ${salt}: why?`;

function engine(role: "prefill" | "decode", i: number, gatewayRegistry: string | undefined, extra: Partial<EngineNodeOptions> = {}): Promise<EngineNode> {
  return startEngineNode({
    role,
    workerId: `${role}-${i}`,
    model: fakeServedModel(),
    blockTokens: 4,
    numBlocks: 512,
    ...(gatewayRegistry ? { gatewayRegistry } : {}),
    heartbeatIntervalMs: INTERVAL_MS,
    heartbeatTimeoutMs: 300,
    handleTtlS: 60,
    ...extra,
  });
}

function inProcessGateway(host = "127.0.0.1", registryPort = 0): Promise<Gateway> {
  return startGateway({
    ...GATEWAY_TUNING,
    tokenizer: fakeServedModel().tokenizer,
    modelName: "fake",
    maxModelLen: 512,
    host,
    registryPort,
    heartbeatIntervalMs: INTERVAL_MS,
    routingHeaders: true,
  });
}

/** A replica in a process of its own, so the test can SIGKILL it. */
async function processGateway() {
  const p = spawnProc([process.execPath, "test/support/gateway-proc.ts", String(INTERVAL_MS)]);
  const ready = await p.ready();
  return { proc: p.proc, http: String(ready.http), registry: String(ready.registry), gatewayId: String(ready.gateway_id) };
}

async function until(what: string, ok: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<number> {
  const t0 = Date.now();
  while (!(await ok())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await Bun.sleep(10);
  }
  return Date.now() - t0;
}

const listed = async (registry: string) => (await new GrpcRegistry(registry, 2000).listWorkers()).map((w) => w.status!.workerId).sort();

async function complete(http: string, body: Record<string, unknown>) {
  const res = await fetch(`http://${http}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ max_tokens: 8, temperature: 0, ...body }),
  });
  return res;
}

/** A handle D holds that no client will claim: a Prefill asked for by `gatewayId`, never resumed. */
async function orphan(P: EngineNode, D: EngineNode, gatewayId: string, salt: number): Promise<string> {
  const h = await grpcClient(EngineControl, P.grpcAddress).prefill(
    create(PrefillRequestSchema, {
      requestId: `orphan-${salt}`,
      prompt: prompt(100 + salt),
      sampling: { maxTokens: 8 },
      decodeTarget: D.kvAddress,
      kvFormat: 1,
      gatewayId,
    }),
  );
  return h.handleId;
}

/** Two in-process replicas and P, D0, D1 beating to both, once both list all three; `done` stops them all. */
async function twoReplicas() {
  const A = await inProcessGateway();
  const B = await inProcessGateway();
  const regs = `${A.registryAddress},${B.registryAddress}`;
  const nodes = [await engine("prefill", 0, regs), await engine("decode", 0, regs), await engine("decode", 1, regs)];
  const done = async () => {
    for (const n of nodes) await n.shutdown();
    await A.stop();
    await B.stop();
  };
  await until("both replicas list 3 workers", () => A.registry.live().length === 3 && B.registry.live().length === 3).catch(async (e: unknown) => {
    await done();
    throw e;
  });
  return { A, B, nodes, done };
}

test("a replica that never saw a prompt routes it to the decode engine holding it, from the engines' events", async () => {
  const { A, B, done } = await twoReplicas();
  try {
    // A routes the prompt to decode-1 (decode-0 is suspect to it); B never saw it.
    A.suspects.mark("decode-0");
    const a = await complete(A.httpAddress, { prompt: prompt(1) });
    expect(a.status).toBe(200);
    expect(a.headers.get("x-tl-decode-worker")).toBe("decode-1");
    await a.text();
    // decode-1's next beats tell B what it holds; B's own choice would have been decode-0 (the tie).
    await until("B's index holds decode-1's blocks", () => B.prefixIndex.size > 0, 2000).catch(() => {});
    const b = await complete(B.httpAddress, { prompt: prompt(1) });
    expect(b.status).toBe(200);
    expect(b.headers.get("x-tl-decode-worker")).toBe("decode-1");
    await b.text();
  } finally {
    await done();
  }
});

test("kill -9 of one replica of two under load: the other's requests all succeed, its handles stay, the dead one's are freed long before the TTL", async () => {
  const A = await inProcessGateway();
  const B = await processGateway();
  const regs = `${A.registryAddress},${B.registry}`;
  const P = await engine("prefill", 0, regs);
  const Ds = [await engine("decode", 0, regs), await engine("decode", 1, regs)];
  const nodes = [P, ...Ds];
  try {
    await until("A lists 3 workers", () => A.registry.live().length === 3);
    await until("B lists 3 workers", async () => (await listed(B.registry)).length === 3);
    for (const D of Ds) (D.model.runner as FakeRunner).slowMs = 2;
    // Handles each replica asked for and whose clients never came (between Prefill and resume).
    const fromB = [await orphan(P, Ds[0]!, B.gatewayId, 1), await orphan(P, Ds[1]!, B.gatewayId, 2)];
    const fromA = await orphan(P, Ds[0]!, A.gatewayId, 3);
    expect(Ds[0]!.receiver!.pending() + Ds[1]!.receiver!.pending()).toBe(3);

    // Bounded load: 12 streams on each replica at once; B dies while they run.
    const run = (http: string, i: number) =>
      complete(http, { prompt: prompt(i), max_tokens: 40, stream: true }).then(
        async (res) => ({ status: res.status, sse: res.status === 200 ? await readSse(res).catch((e: unknown) => ({ broke: String(e) }) as const) : null }),
        (e: unknown) => ({ status: 0, sse: null, error: String(e) }),
      );
    const onA = Array.from({ length: 12 }, (_, i) => run(A.httpAddress, i));
    const onB = Array.from({ length: 12 }, (_, i) => run(B.http, 20 + i));
    await Bun.sleep(40);
    B.proc.kill("SIGKILL");
    const a = await Promise.all(onA);
    await Promise.all(onB);
    // Every request sent to the live replica succeeded, whole.
    expect(a.map((r) => [r.status, r.sse && "done" in r.sse ? r.sse.done && r.sse.error === null : false])).toEqual(a.map(() => [200, true]));

    // The dead replica's handles go once its beats fail (3 intervals), not after the 60 s TTL;
    // A's stays for its client.
    // Half the TTL is the structural bound: generous for a loaded machine, and a release by
    // the TTL would miss it.
    await until("B's orphaned handles are freed", () => Ds[1]!.receiver!.pending() === 0 && Ds[0]!.receiver!.pending() === 1, 30_000);
    expect(await grpcClient(KvTransfer, Ds[0]!.kvAddress).release({ handleId: fromA })).toMatchObject({ released: true });
    expect(fromB.length).toBe(2);
    await until("every pool at baseline", () => nodes.every((n) => n.pool.used === 0 && (n.receiver?.pending() ?? 0) === 0), 20_000);
    await until("A drops nobody", () => A.registry.live().length === 3);
  } finally {
    for (const n of nodes) await n.shutdown();
    await A.stop();
  }
});

test("a DNS name re-resolved every interval adds and removes a replica", async () => {
  const A = await inProcessGateway("127.0.0.1");
  const port = Number(A.registryAddress.slice(A.registryAddress.lastIndexOf(":") + 1));
  const C = await inProcessGateway("127.0.0.2", port);
  let answer = ["127.0.0.1"];
  const resolver = async (host: string) => {
    expect(host).toBe("gateways.test");
    return answer;
  };
  const P = await engine("prefill", 0, undefined);
  const D = await engine("decode", 0, `dns:gateways.test:${port}`, { resolver });
  try {
    await until("A lists decode-0", () => A.registry.live().length === 1);
    await Bun.sleep(3 * INTERVAL_MS);
    expect(C.registry.live()).toEqual([]);
    // The name now has two addresses: the engine beats to both.
    answer = ["127.0.0.1", "127.0.0.2"];
    await until("C lists decode-0", () => C.registry.live().length === 1);
    expect(D.heartbeat!.addresses).toEqual([`127.0.0.1:${port}`, `127.0.0.2:${port}`]);
    // A handle each replica asked for; then A leaves the name.
    await orphan(P, D, A.gatewayId, 1);
    const fromC = await orphan(P, D, C.gatewayId, 2);
    expect(D.receiver!.pending()).toBe(2);
    answer = ["127.0.0.2"];
    await until("A's handle is freed as A left the name", () => D.receiver!.pending() === 1);
    expect(D.heartbeat!.addresses).toEqual([`127.0.0.2:${port}`]);
    await until("A evicts decode-0", () => A.registry.live().length === 0);
    // C keeps it, as its beats go on (waited for: on a loaded machine a beat can come 3 intervals late).
    await until("C lists decode-0", () => C.registry.live().length === 1);
    expect(await grpcClient(KvTransfer, D.kvAddress).release({ handleId: fromC })).toMatchObject({ released: true });
    // A lookup that fails keeps the addresses it gave last.
    answer = null as unknown as string[];
    await Bun.sleep(3 * INTERVAL_MS);
    expect(D.heartbeat!.addresses).toEqual([`127.0.0.2:${port}`]);
  } finally {
    await D.shutdown();
    await P.shutdown();
    await A.stop();
    await C.stop();
  }
});

test("draining one replica loses no request: readiness says 503 at once, its streams finish, new requests go to the other", async () => {
  const { A, B, nodes, done } = await twoReplicas();
  try {
    for (const D of nodes.slice(1)) (D.model.runner as FakeRunner).slowMs = 2;
    // A client that, as a load balancer does, sends elsewhere what a replica refuses with 503.
    const replicas = [A.httpAddress, B.httpAddress];
    let rr = 0;
    const send = async (i: number) => {
      let at = rr++ % 2;
      for (let tries = 0; tries < 2; tries++, at ^= 1) {
        const res = await complete(replicas[at]!, { prompt: prompt(i), max_tokens: 30, stream: true });
        if (res.status === 503) {
          await res.text();
          continue;
        }
        return { status: res.status, sse: await readSse(res) };
      }
      return { status: 503, sse: null };
    };
    const first = Array.from({ length: 10 }, (_, i) => send(i));
    await Bun.sleep(30);
    const drained = B.drain(10_000);
    // Readiness flips before any stream finishes.
    expect((await fetch(`http://${B.httpAddress}/health`)).status).toBe(503);
    const later = Array.from({ length: 10 }, (_, i) => send(50 + i));
    const all = await Promise.all([...first, ...later]);
    expect(await drained).toBe(0);
    expect(all.map((r) => [r.status, r.sse?.done === true && r.sse.error === null])).toEqual(all.map(() => [200, true]));
  } finally {
    await done();
  }
});
