// A cluster of 1 prefill + 2 decode + gateway under load and random faults, then the
// accounting: every pool at baseline, no handle pending, no handle that only its time
// to live freed except those the test left unclaimed on purpose, every completed
// request equal to a colocated engine's answer, and every failed one told so.
//
// Default: a few hundred requests (< 60 s). TL_SOAK=1: a few thousand. TL_SOAK_REQUESTS
// and TL_SOAK_SEED override the count and the seed.
import { afterAll, expect, test } from "bun:test";
import { startEngineNode, type EngineNode, type EngineNodeOptions } from "../../src/cli/engine-node.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { startGateway, type Gateway } from "../../src/gateway/index.ts";
import { sseData } from "../../src/http/index.ts";
import { stream } from "../../src/rng/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { type ClaimedHandle, KvError, type KvReceiver } from "../../src/transfer/index.ts";
import { startCuttingProxy, type CuttingProxy } from "../support/cutting-proxy.ts";
import { fakeServedModel, GATEWAY_TUNING } from "../support/nodes.ts";

const LONG = process.env.TL_SOAK === "1";
const N = Number(process.env.TL_SOAK_REQUESTS ?? (LONG ? 3000 : 300));
const SEED = Number(process.env.TL_SOAK_SEED ?? 20240607);
const CONCURRENCY = 8;
const REQUEST_TIMEOUT_MS = 20_000;
const HANDLE_TTL_S = 1;
const B = 4;
const EOS = 257;

/** The run's seeded PCG32 stream (src/rng), so a failing run can be replayed. */
function rng(seed: number): () => number {
  const r = stream(seed, "soak");
  return () => r.uniformF64();
}

// ---------------------------------------------------------------------------------------
// Handle accounting on every receiver: what was accepted, claimed, released; the rest expired.

interface Ledger {
  node: string;
  accepted: Set<string>;
  claimed: Set<string>;
  released: Set<string>;
  /** handles a resume asked for after they were gone (expired): D answered 404 */
  missed: Set<string>;
  /** handles a resume named with the wrong prompt (409; the handle stays) */
  faulted: Set<string>;
  notFound: number;
}

function instrument(node: EngineNode): Ledger {
  const rx = node.receiver as KvReceiver;
  const l: Ledger = { node: node.workerId, accepted: new Set(), claimed: new Set(), released: new Set(), missed: new Set(), faulted: new Set(), notFound: 0 };
  const begin = rx.begin.bind(rx);
  const claim = rx.claim.bind(rx);
  const release = rx.release.bind(rx);
  rx.begin = (handleId, total, peer) => {
    const s = begin(handleId, total, peer);
    const accept = s.accept.bind(s);
    const finish = s.finish.bind(s);
    s.accept = (c) => {
      try {
        accept(c);
      } catch (e) {
        // An empty chunk for a block D evicted after HasBlocks: the prefill side resends.
        if (e instanceof KvError && e.code === Code.NotFound) l.notFound++;
        throw e;
      }
    };
    s.finish = () => {
      const ack = finish();
      l.accepted.add(handleId);
      return ack;
    };
    return s;
  };
  rx.claim = ((h: string, fits?: (c: ClaimedHandle) => string | null) => {
    const r = fits === undefined ? claim(h) : claim(h, fits);
    if (r === null) l.missed.add(h);
    else if ("fault" in r) l.faulted.add(h);
    else l.claimed.add(h);
    return r;
  }) as typeof rx.claim;
  rx.release = (h, by) => {
    const r = release(h, by);
    if (r) l.released.add(h);
    return r;
  };
  return l;
}

// ---------------------------------------------------------------------------------------
// One client request and what became of it.

interface Req {
  i: number;
  body: {
    prompt: string;
    max_tokens: number;
    temperature: number;
    seed: number;
    stream: boolean;
    return_token_ids: true;
    stream_options?: { include_usage: true };
  };
  /** abort after this many SSE events (streams) or before the answer (-1); undefined: read to the end */
  abortAt?: number;
}

type Outcome =
  | { kind: "ok"; tokens: number[]; finish: string; served: string }
  | { kind: "error"; how: "status" | "event" | "transport"; detail: string }
  | { kind: "aborted" }
  | { kind: "hung"; detail: string }
  | { kind: "truncated"; detail: string };

const SYSTEMS = [
  "You are a helpful assistant. Answer briefly. ",
  "Translate into French: the cat sat on the mat. ",
  "Summarize the following text in one line: ",
];
const LETTERS = "abcdefghijklmnopqrstuvwxyz ,.";

function makeRequest(i: number, r: () => number): Req {
  let prompt = r() < 0.6 ? SYSTEMS[Math.floor(r() * SYSTEMS.length)]! : "";
  const extra = 1 + Math.floor(r() * 60);
  for (let k = 0; k < extra; k++) prompt += LETTERS[Math.floor(r() * LETTERS.length)];
  const stream = r() < 0.6;
  const body: Req["body"] = {
    prompt,
    max_tokens: 1 + Math.floor(r() * 24),
    temperature: r() < 0.5 ? 0 : 0.8,
    seed: Math.floor(r() * 1e9),
    stream,
    return_token_ids: true,
    ...(stream ? { stream_options: { include_usage: true as const } } : {}),
  };
  const req: Req = { i, body };
  if (r() < 0.12) req.abortAt = stream ? Math.floor(r() * (body.max_tokens + 2)) - 1 : -1;
  return req;
}

async function send(addr: string, req: Req): Promise<Outcome> {
  const ac = new AbortController();
  const timeout = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
  const signal = AbortSignal.any([ac.signal, timeout]);
  const hung = () => ({ kind: "hung" as const, detail: `request ${req.i} (${JSON.stringify(req.body)}) took over ${REQUEST_TIMEOUT_MS} ms` });
  let res: Response;
  try {
    const p = fetch(`http://${addr}/v1/completions`, {
      method: "POST",
      body: JSON.stringify(req.body),
      signal,
      headers: { "content-type": "application/json", "x-request-id": `soak-${req.i}` },
    });
    if (req.abortAt === -1) {
      // The client goes away at a random moment before the answer.
      const settled = p.then(
        () => {},
        () => {},
      );
      await Bun.sleep(Math.floor(Math.random() * 20));
      ac.abort();
      await settled;
      return { kind: "aborted" };
    }
    res = await p;
  } catch (e) {
    if (timeout.aborted) return hung();
    return { kind: "error", how: "transport", detail: String(e) };
  }
  const served = res.headers.get("x-tl-served") ?? "";
  try {
    if (res.status !== 200) {
      const j = (await res.json()) as { error?: { message?: string } };
      if (typeof j.error?.message !== "string") return { kind: "truncated", detail: `status ${res.status} without an error body` };
      return { kind: "error", how: "status", detail: `${res.status} ${j.error.message}` };
    }
    if (!req.body.stream) {
      const j = (await res.json()) as { choices: { token_ids: number[]; finish_reason: string }[]; usage: { completion_tokens: number } };
      const c = j.choices[0]!;
      return { kind: "ok", tokens: c.token_ids, finish: c.finish_reason, served };
    }
    let events = 0;
    const tokens: number[] = [];
    let finish = "";
    let usage = -1;
    // Leaving this loop (a return) cancels the body.
    for await (const data of sseData(res.body!)) {
      if (data === "[DONE]") {
        if (usage !== tokens.length) return { kind: "truncated", detail: `request ${req.i}: usage says ${usage} tokens, stream carried ${tokens.length}` };
        return { kind: "ok", tokens, finish, served };
      }
      const ev = JSON.parse(data) as {
        error?: { message: string };
        choices: { token_ids?: number[]; finish_reason: string | null }[];
        usage?: { completion_tokens: number };
      };
      if (ev.error) return { kind: "error", how: "event", detail: ev.error.message };
      for (const c of ev.choices) {
        tokens.push(...(c.token_ids ?? []));
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (ev.usage) usage = ev.usage.completion_tokens;
      if (++events === req.abortAt) {
        ac.abort();
        return { kind: "aborted" };
      }
    }
    return { kind: "truncated", detail: `request ${req.i}: stream ended after ${tokens.length} tokens without [DONE] or an error event` };
  } catch (e) {
    if (timeout.aborted) return hung();
    if (ac.signal.aborted) return { kind: "aborted" };
    // The connection broke under the client (a gateway restart): an error it cannot miss.
    return { kind: "error", how: "transport", detail: String(e) };
  }
}

// ---------------------------------------------------------------------------------------

const stops: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const s of stops.reverse()) await s().catch(() => {});
});

test(
  "soak returns pools to baseline",
  async () => {
    const started = performance.now();
    const r = rng(SEED);
    const model = fakeServedModel();
    let gateway: Gateway = await startGateway({
      ...GATEWAY_TUNING,
      tokenizer: model.tokenizer,
      modelName: "fake",
      maxModelLen: 512,
      heartbeatIntervalMs: 100,
    });
    const port = (a: string) => Number(a.slice(a.lastIndexOf(":") + 1));
    const gwHttpPort = port(gateway.httpAddress);
    const gwRegistryPort = port(gateway.registryAddress);
    const gwAddress = gateway.httpAddress;
    stops.push(() => gateway.stop());

    const nodeOpts = (role: "prefill" | "decode", workerId: string, extra: Partial<EngineNodeOptions> = {}): EngineNodeOptions => ({
      role,
      workerId,
      model: fakeServedModel(),
      blockTokens: B,
      numBlocks: 256,
      gatewayRegistry: gateway.registryAddress,
      heartbeatIntervalMs: 100,
      heartbeatTimeoutMs: 500,
      handleTtlS: HANDLE_TTL_S,
      ...extra,
    });
    const prefill = await startEngineNode(nodeOpts("prefill", "prefill-0"));
    const d0 = await startEngineNode(nodeOpts("decode", "decode-0"));
    // decode-1: a small pool (its dedup blocks get evicted between HasBlocks and PushKv), reached
    // over gRPC only through a proxy that cuts its connections every few pushes.
    let d1: EngineNode | null = null;
    let d1Real = "";
    const proxy: CuttingProxy = await startCuttingProxy(() => d1Real, { cutAfterBytes: 24_000 });
    const d1Opts = nodeOpts("decode", "decode-1", { numBlocks: 48, offerDataPlane: false, advertiseKvAddress: proxy.address });
    d1 = await startEngineNode(d1Opts);
    d1Real = d1.kvAddress;
    const solo = await startEngineNode({ role: "both", workerId: "reference", model: fakeServedModel(), blockTokens: B, numBlocks: 256 });
    const nodes: EngineNode[] = [prefill, d0, d1];
    stops.push(
      () => proxy.close(),
      () => solo.shutdown(),
      () => prefill.shutdown(),
      () => d0.shutdown(),
      async () => d1?.shutdown(),
    );
    const ledgers = [instrument(d0), instrument(d1)];
    const waitLive = async (n: number, ms: number) => {
      const end = Date.now() + ms;
      while (gateway.registry.live().length < n && Date.now() < end) await Bun.sleep(10);
      return gateway.registry.live().length;
    };
    expect(await waitLive(3, 5_000)).toBe(3);

    const faults = {
      abortsPlanned: 0,
      evictStorms: 0,
      releaseStorms: 0,
      releaseCalls: 0,
      directPrefills: 0,
      directReleased: 0,
      d1Restarts: 0,
      gatewayRestarts: 0,
    };
    const directLeft = new Set<string>();
    const chaos: Promise<unknown>[] = [];

    const evictAll = (n: EngineNode) => {
      const ids = n.pool.allocate(n.pool.free + n.pool.cached);
      if (ids !== null) n.pool.releaseAll(ids);
    };
    const liveDecodes = () => gateway.registry.live().filter((w) => w.status.kvAddress !== "");

    async function directPrefill(i: number): Promise<void> {
      const ds = liveDecodes();
      if (ds.length === 0) return;
      const target = ds[Math.floor(r() * ds.length)]!.status.kvAddress;
      const prompt = Array.from({ length: 3 + Math.floor(r() * 30) }, () => Math.floor(r() * 250));
      try {
        const h = await grpcClient(EngineControl, prefill.grpcAddress, { timeoutMs: 5_000 }).prefill({
          requestId: `direct-${i}`,
          promptTokens: prompt,
          sampling: { temperature: 0, maxTokens: 4, stopTokenIds: [] },
          decodeTarget: target,
          kvFormat: 1,
        });
        faults.directPrefills++;
        if (h.finished) return;
        if (r() < 0.3) {
          const released = await grpcClient(KvTransfer, target, { timeoutMs: 5_000 }).release({ handleId: h.handleId });
          expect(released.released).toBe(true);
          faults.directReleased++;
        } else directLeft.add(h.handleId);
      } catch {
        // a cut stream or a restarting engine: the refusal freed everything, which the end checks
      }
    }

    async function releaseStorm(): Promise<void> {
      faults.releaseStorms++;
      const targets = [...liveDecodes().map((w) => w.status.kvAddress)];
      await Promise.all(
        Array.from({ length: 40 }, async (_, k) => {
          const t = targets[k % Math.max(1, targets.length)];
          if (t === undefined) return;
          faults.releaseCalls++;
          const id = k % 5 === 0 ? "" : `unknown-${Math.floor(r() * 1e9).toString(36)}`;
          const res = await grpcClient(KvTransfer, t, { timeoutMs: 5_000 })
            .release({ handleId: id })
            .catch(() => null);
          if (res !== null) expect(res.released).toBe(false);
        }),
      );
    }

    async function restartD1(): Promise<void> {
      const old = d1!;
      await old.shutdown(0);
      // Everything the killed engine held went back with it.
      expect({ used: old.pool.used, pending: old.receiver!.pending() }).toEqual({ used: 0, pending: 0 });
      await Bun.sleep(200 + Math.floor(r() * 200));
      d1 = await startEngineNode(d1Opts);
      d1Real = d1.kvAddress;
      nodes[2] = d1;
      ledgers.push(instrument(d1));
      faults.d1Restarts++;
    }

    async function restartGateway(): Promise<void> {
      await gateway.stop();
      await Bun.sleep(100);
      gateway = await startGateway({
        ...GATEWAY_TUNING,
        tokenizer: model.tokenizer,
        modelName: "fake",
        maxModelLen: 512,
        heartbeatIntervalMs: 100,
        httpPort: gwHttpPort,
        registryPort: gwRegistryPort,
      });
      faults.gatewayRestarts++;
    }

    // The requests: CONCURRENCY clients take the next index; faults are keyed to indices.
    const reqs = Array.from({ length: N }, (_, i) => makeRequest(i, r));
    const outcomes: Outcome[] = new Array(N);
    let next = 0;
    async function client(): Promise<void> {
      for (;;) {
        const i = next++;
        if (i >= N) return;
        if (i === Math.floor(N * 0.3)) chaos.push(restartD1());
        if (i === Math.floor(N * 0.65)) chaos.push(restartGateway());
        if (i % 10 === 5) {
          faults.evictStorms++;
          evictAll(r() < 0.5 ? d0 : d1!);
        }
        if (i % 20 === 7) chaos.push(releaseStorm());
        if (i % 15 === 3) chaos.push(directPrefill(i));
        if (reqs[i]!.abortAt !== undefined) faults.abortsPlanned++;
        const o = (outcomes[i] = await send(gwAddress, reqs[i]!));
        // Like a real client, back off a little when the front door is down.
        if (o.kind === "error" && o.how === "transport") await Bun.sleep(25);
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, () => client()));
    await Promise.all(chaos);
    const loadMs = performance.now() - started;

    // --- accounting ---------------------------------------------------------------------
    const atBaseline = () => nodes.every((n) => n.pool.used === 0 && (n.receiver?.pending() ?? 0) === 0 && (n.receiver?.inFlight() ?? 0) === 0);
    const end = Date.now() + 5_000;
    while (!atBaseline() && Date.now() < end) await Bun.sleep(20);
    for (const n of nodes) {
      expect({
        node: n.workerId,
        used: n.pool.used,
        pending: n.receiver?.pending() ?? 0,
        inFlight: n.receiver?.inFlight() ?? 0,
        running: n.engine.inFlight,
      }).toEqual({
        node: n.workerId,
        used: 0,
        pending: 0,
        inFlight: 0,
        running: 0,
      });
    }

    // Handles freed only by their time to live: exactly those the test left unclaimed on purpose.
    const expired: string[] = [];
    for (const l of ledgers) for (const h of l.accepted) if (!l.claimed.has(h) && !l.released.has(h)) expired.push(h);
    // Besides those: a handle whose time ran out before a slow resume claimed it: D answered
    // that resume 404, and its client an error (no outcome is hung or truncated, below).
    // Handle ids are random capabilities that no message repeats, so the ledger ties them.
    const toldExpired = (h: string) => ledgers.some((l) => l.missed.has(h));
    const leaked = expired.filter((h) => !directLeft.has(h) && !toldExpired(h));
    const why = (h: string) =>
      `${h}: ${JSON.stringify({ faulted: ledgers.some((l) => l.faulted.has(h)), accepted: ledgers.find((l) => l.accepted.has(h))?.node })}`;
    expect(leaked.map(why)).toEqual([]);

    const byKind = new Map<string, number>();
    const bad: string[] = [];
    for (const o of outcomes) {
      const k = o.kind === "error" ? `error-${o.how}` : o.kind;
      byKind.set(k, (byKind.get(k) ?? 0) + 1);
      if (o.kind === "hung" || o.kind === "truncated") bad.push(o.detail);
    }
    expect(bad).toEqual([]);
    const errorKinds = new Map<string, number>();
    for (const o of outcomes) {
      if (o.kind !== "error") continue;
      const k = o.detail
        .replace(/\d+/g, "N")
        .replace(/soak-N\.\w+/g, "H")
        .slice(0, 110);
      errorKinds.set(k, (errorKinds.get(k) ?? 0) + 1);
    }

    // Every completed request: the right count, and the colocated engine's exact tokens.
    const mismatches: string[] = [];
    const completed = outcomes.map((o, i) => [o, reqs[i]!] as const).filter(([o]) => o.kind === "ok") as [Extract<Outcome, { kind: "ok" }>, Req][];
    let k = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        for (;;) {
          const j = k++;
          if (j >= completed.length) return;
          const [o, req] = completed[j]!;
          const res = await fetch(`http://${solo.httpAddress}/v1/completions`, {
            method: "POST",
            body: JSON.stringify({ ...req.body, stream: false, stream_options: undefined }),
          });
          const want = (await res.json()) as { choices: { token_ids: number[]; finish_reason: string }[] };
          const w = want.choices[0]!;
          const countOk = o.finish === "stop" ? o.tokens.at(-1) === EOS : o.tokens.length === req.body.max_tokens;
          if (!countOk || o.finish !== w.finish_reason || JSON.stringify(o.tokens) !== JSON.stringify(w.token_ids)) {
            mismatches.push(
              `request ${req.i} (${o.served}, ${JSON.stringify(req.body)}): got ${o.finish} ${JSON.stringify(o.tokens)}, colocated ${w.finish_reason} ${JSON.stringify(w.token_ids)}`,
            );
          }
        }
      }),
    );
    expect(mismatches).toEqual([]);
    expect(solo.pool.used).toBe(0);

    const served = new Map<string, number>();
    for (const [o] of completed) served.set(o.served, (served.get(o.served) ?? 0) + 1);
    const notFound = ledgers.reduce((a, l) => a + l.notFound, 0);
    console.log(
      // Errors here are the injected faults at work (a gateway and a decode engine restarted,
      // connections refused and reset meanwhile); the checks below decide pass or fail.
      `soak (errors below are expected under the injected faults): ${N} requests in ${(loadMs / 1000).toFixed(1)} s (seed ${SEED}); outcomes ${JSON.stringify(Object.fromEntries(byKind))}; ` +
        `served ${JSON.stringify(Object.fromEntries(served))}; errors ${JSON.stringify(Object.fromEntries(errorKinds), null, 1)}; faults ${JSON.stringify({ ...faults, kvCuts: proxy.cuts(), evictedDedupResends: notFound, handlesExpired: expired.length })}`,
    );
    // The faults happened, and the run still served most requests (else it proves nothing).
    expect(faults.d1Restarts).toBe(1);
    expect(faults.gatewayRestarts).toBe(1);
    expect(proxy.cuts()).toBeGreaterThan(0);
    expect(expired.length).toBeGreaterThan(0);
    expect(completed.length).toBeGreaterThan(N * 0.5);
  },
  LONG ? 900_000 : 180_000,
);
