// Routing under real traffic (issue 14), gateway + 1 prefill + 2 decode engines as
// processes on loopback, the embedded model:
//   1. burst: 100 concurrent streams; the busier decode engine's share (target ≤ 0.6).
//   2. freeze: one decode engine SIGSTOPped; requests arriving after the freeze, their
//      latency over the same requests' latency before it (target ≤ 2×).
//   3. conditional disaggregation: TTFT of prompts of growing length while the decode
//      engine runs other streams, prefilled on P (disaggregated) and on D itself
//      (decode-local); the length where disaggregated TTFT stops losing is the measured
//      default of [gateway] disagg_min_uncached_tokens.
//   4. replicas (issue 28): shared system prompts over 2 gateway replicas, routing on the
//      engines' KV events vs on each replica's own routing (kv_events = false), against one
//      gateway: prefix-hit rate and blocks sent; KV event traffic per engine per second.
//   5. burst2: a burst of 100 split over 2 replicas; the busier decode engine's share.
//   6. kill: kill -9 of one replica of two under a bounded load: the other's success rate,
//      and how long until every pool and handle is back at baseline.
//   7. memory: the gateway's prefix index with 10^6 blocks, against a Map of bigints.
// Writes bench/results/routing.json. Machines are shared: read ratios, and the load printed.
//
//   npx bun bench/routing.ts
//   BENCH_ROUTING_PARTS=burst,freeze,disagg,replicas,burst2,kill,memory   a subset
import { cpus, loadavg } from "node:os";
import { create } from "@bufbuild/protobuf";
import { PrefixIndex } from "../src/gateway/index.ts";
import { KvEventSchema, KvEventsSchema } from "../src/gen/tl/control/v1/control_pb.ts";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type RoleProcess, roleArgs, spawnRole } from "../src/cli/spawn-role.ts";
import { sseData } from "../src/http/index.ts";

const ROOT = join(import.meta.dir, "..");
const ALL_PARTS = "burst,freeze,disagg,replicas,burst2,kill,memory";
const PARTS = new Set((process.env.BENCH_ROUTING_PARTS ?? ALL_PARTS).split(","));
/** Beats every second: a frozen engine is a beat late (suspect) after 1 s, evicted after 3 s. */
const BEAT_MS = 1000;
const LENGTHS = [16, 32, 64, 128, 256, 512, 1024, 1536];
/** Streams kept running on the decode engine while TTFT is measured: a decode engine at work. */
const BACKGROUND = 8;
/** The freeze part: output tokens per request, and the gap that makes an engine suspect. */
const FREEZE_OUTPUT = Number(process.env.BENCH_ROUTING_FREEZE_OUTPUT ?? 128);
const STALL_MS = 200;

function spawn(name: string, args: string[]): RoleProcess {
  return spawnRole(name, [process.execPath, join(ROOT, "bin/engine.ts"), ...args], {
    env: { ...process.env, TL_LOG_LEVEL: process.env.BENCH_LOG_LEVEL ?? "error" },
    stderr: "tail",
  });
}

interface Cluster {
  base: string;
  /** Every gateway replica's HTTP base (base is the first). */
  bases: string[];
  gateways: RoleProcess[];
  decode: RoleProcess[];
  /** Every engine's HTTP base (its /metrics). */
  engines: string[];
  stop(): Promise<void>;
}

async function startCluster(decodes: number, gatewayFlags: string[], opts: { gateways?: number; engineFlags?: string[] } = {}): Promise<Cluster> {
  const children: RoleProcess[] = [];
  const stop = async () => {
    for (const c of children) {
      c.proc.kill("SIGCONT");
      c.proc.kill("SIGTERM");
    }
    await Promise.all(children.map((c) => Promise.race([c.proc.exited, Bun.sleep(5000).then(() => c.proc.kill("SIGKILL"))])));
  };
  const beat = ["--heartbeat-interval-ms", String(BEAT_MS)];
  // --routing-headers: the burst counts which decode engine served each request.
  const gws = Array.from({ length: opts.gateways ?? 1 }, (_, i) => spawn(`gateway-${i}`, roleArgs("gateway", [...beat, "--routing-headers", ...gatewayFlags])));
  children.push(...gws);
  const gs = await Promise.all(gws.map((g) => g.ready));
  const registries = gs.map((x) => String(x.registry)).join(",");
  const engine = (role: "prefill" | "decode", id: string) =>
    spawn(id, roleArgs(role, ["--worker-id", id, ...beat, "--gateway-registry", registries, ...(opts.engineFlags ?? [])]));
  const p = engine("prefill", "prefill-0");
  const ds = Array.from({ length: decodes }, (_, i) => engine("decode", `decode-${i}`));
  children.push(p, ...ds);
  try {
    const ready = await Promise.all(children.map((c) => c.ready));
    const bases = gs.map((x) => `http://${String(x.http)}`);
    const end = Date.now() + 30_000;
    for (const base of bases) {
      for (;;) {
        const { workers } = (await (await fetch(`${base}/health`)).json()) as { workers: { decode: number; prefill: number } };
        if (workers.decode === decodes && workers.prefill === 1) break;
        if (Date.now() > end) throw new Error(`engines never registered: ${JSON.stringify(workers)}`);
        await Bun.sleep(50);
      }
    }
    const engines = ready.slice(gws.length).map((r) => `http://${String(r.http)}`);
    return { base: bases[0]!, bases, gateways: gws, decode: ds, engines, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

interface Result {
  ok: boolean;
  decode: string;
  served: string;
  gateway: string;
  blocksSent: number;
  blocksDeduped: number;
  ttftMs: number;
  totalMs: number;
  error?: string;
}

/** Byte prompts (no BOS/EOS inside) unique to `salt`. */
function prompt(len: number, salt: number): number[] {
  return Array.from({ length: len }, (_, i) => (Math.imul(i + 1, 2654435761) ^ Math.imul(salt + 7, 40503)) & 0xff);
}

async function send(base: string, tokens: number[], maxTokens: number): Promise<Result> {
  const t0 = performance.now();
  const r: Result = { ok: false, decode: "", served: "", gateway: "", blocksSent: 0, blocksDeduped: 0, ttftMs: NaN, totalMs: NaN };
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: tokens, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
    });
    r.decode = res.headers.get("x-tl-decode-worker") ?? "";
    r.served = res.headers.get("x-tl-served") ?? "";
    r.gateway = res.headers.get("x-tl-gateway") ?? "";
    r.blocksSent = Number(res.headers.get("x-tl-blocks-sent") ?? 0);
    r.blocksDeduped = Number(res.headers.get("x-tl-blocks-deduped") ?? 0);
    if (res.status !== 200) throw new Error(`status ${res.status}: ${(await res.text()).slice(0, 200)}`);
    for await (const data of sseData(res.body!)) {
      if (data === "[DONE]") r.ok = true;
      else if (Number.isNaN(r.ttftMs)) r.ttftMs = performance.now() - t0;
      if (data !== "[DONE]" && (JSON.parse(data) as { error?: { message: string } }).error) throw new Error(data.slice(0, 200));
    }
  } catch (e) {
    r.error = e instanceof Error ? e.message : String(e);
  }
  r.totalMs = performance.now() - t0;
  return r;
}

const median = (xs: number[]) => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)]!;
};
const load = () => loadavg().map((x) => Number(x.toFixed(2)));
const results: Record<string, unknown> = { machine: { cores: navigator.hardwareConcurrency, cpu: cpus()[0]?.model, loadavgAtStart: load() } };
console.log(`load average at start: ${load().join(" ")}`);

async function burst(): Promise<void> {
  const c = await startCluster(2, ["--disagg-min-uncached-tokens", "0"]);
  try {
    await send(c.base, prompt(32, -1), 4); // warm up
    const rs = await Promise.all(Array.from({ length: 100 }, (_, i) => send(c.base, prompt(48, i), 16)));
    const by = new Map<string, number>();
    for (const r of rs) by.set(r.decode, (by.get(r.decode) ?? 0) + 1);
    const busier = Math.max(...by.values()) / rs.length;
    const ok = rs.filter((r) => r.ok).length;
    for (const r of rs.filter((x) => !x.ok).slice(0, 2)) console.log(`  failed: ${r.error}`);
    console.log(`burst of 100: per decode engine ${JSON.stringify(Object.fromEntries(by))}; busier share ${busier.toFixed(2)} (target ≤ 0.60); ok ${ok}/100`);
    results.burst = { requests: 100, byDecode: Object.fromEntries(by), busierShare: busier, ok, loadavg: load() };
  } finally {
    await c.stop();
  }
}

async function freeze(): Promise<void> {
  // Deadlines a little above what a loaded machine shows, so only the frozen engine misses them.
  const flags = [
    ...["--disagg-min-uncached-tokens", "0", "--prefill-timeout-ms", "1500", "--first-byte-timeout-ms", "1500"],
    ...["--inter-token-timeout-ms", "1000", "--stall-suspect-ms", String(STALL_MS)],
  ];
  const c = await startCluster(2, flags);
  try {
    const N = 16;
    const run = (salt: number) => send(c.base, prompt(64, salt), FREEZE_OUTPUT);
    await run(-1);
    // Normal: the same shape of traffic, requests every 100 ms over two engines, with streams in flight.
    const paced = async (salt0: number) => {
      const out: Promise<Result>[] = [];
      for (let i = 0; i < N; i++) {
        out.push(run(salt0 + i));
        await Bun.sleep(100);
      }
      return Promise.all(out);
    };
    const before = await paced(1000);
    const normal = median(before.map((r) => r.totalMs));
    // Keep streams on both engines at the freeze, as traffic would.
    const inFlight = [run(5000), run(5001), run(5002), run(5003)];
    await Bun.sleep(300);
    const victim = c.decode[1]!;
    victim.proc.kill("SIGSTOP");
    const after = await paced(2000);
    victim.proc.kill("SIGCONT");
    await Promise.all(inFlight);
    for (const r of after) if (!r.ok) console.log(`  failed after the freeze (${r.served} on ${r.decode}): ${r.error}`);
    const ratios = after.map((r) => r.totalMs / normal);
    const within = ratios.filter((x) => x <= 2).length;
    const onVictim = after.filter((r) => r.decode === "decode-1").length;
    console.log(
      `freeze: normal latency ${normal.toFixed(0)} ms; after the freeze p50 ${median(after.map((r) => r.totalMs)).toFixed(0)} ms, max ${Math.max(...after.map((r) => r.totalMs)).toFixed(0)} ms; ` +
        `ratio p50 ${median(ratios).toFixed(2)}, max ${Math.max(...ratios).toFixed(2)}; within 2×: ${within}/${N}; ok ${after.filter((r) => r.ok).length}/${N}; served by the frozen engine ${onVictim}`,
    );
    results.freeze = {
      requests: N,
      outputTokens: FREEZE_OUTPUT,
      stallSuspectMs: STALL_MS,
      normalMs: normal,
      afterMs: after.map((r) => Math.round(r.totalMs)),
      ratioP50: median(ratios),
      ratioMax: Math.max(...ratios),
      within2x: within,
      ok: after.filter((r) => r.ok).length,
      servedOnFrozen: onVictim,
      served: after.map((r) => r.served),
      loadavg: load(),
    };
  } finally {
    await c.stop();
  }
}

/** TTFT by prompt length with the decode engine busy, with the gateway's threshold at `threshold`. */
async function ttftSweep(threshold: number): Promise<{ length: number; ttftMs: number; served: string }[]> {
  const c = await startCluster(1, ["--disagg-min-uncached-tokens", String(threshold)]);
  let stop = false;
  const background = Array.from({ length: BACKGROUND }, async (_, k) => {
    for (let i = 0; !stop; i++) await send(c.base, prompt(24, 9000 + k * 1000 + i), 128);
  });
  try {
    await Bun.sleep(300);
    const out: { length: number; ttftMs: number; served: string }[] = [];
    for (const length of LENGTHS) {
      const rs: Result[] = [];
      for (let i = 0; i < 5; i++) rs.push(await send(c.base, prompt(length, length * 100 + i + threshold), 2));
      out.push({ length, ttftMs: median(rs.map((r) => r.ttftMs)), served: rs[0]!.served });
    }
    return out;
  } finally {
    stop = true;
    await Promise.all(background);
    await c.stop();
  }
}

/**
 * Where disaggregated TTFT stops losing: from the first length after which every ratio
 * is ≤ 1.05 (within noise of a tie), interpolated (in log length) between it and the
 * length before to ratio 1, rounded to 16-token blocks.
 */
function crossover(rows: { length: number; ratio: number }[]): number {
  let i = rows.length;
  while (i > 0 && rows[i - 1]!.ratio <= 1.05) i--;
  if (i === rows.length) return rows.at(-1)!.length * 2;
  if (i === 0) return rows[0]!.length;
  const [a, b] = [rows[i - 1]!, rows[i]!];
  const f = Math.min(1, Math.max(0, (a.ratio - 1) / (a.ratio - b.ratio)));
  return Math.round((a.length * (b.length / a.length) ** f) / 16) * 16;
}

async function disagg(): Promise<void> {
  const remote = await ttftSweep(0);
  const local = await ttftSweep(1_000_000);
  const rows = LENGTHS.map((length, i) => ({
    length,
    disaggregatedMs: remote[i]!.ttftMs,
    decodeLocalMs: local[i]!.ttftMs,
    ratio: remote[i]!.ttftMs / local[i]!.ttftMs,
  }));
  for (const r of rows)
    console.log(
      `prompt ${String(r.length).padStart(4)} tokens: TTFT disaggregated ${r.disaggregatedMs.toFixed(1)} ms, decode-local ${r.decodeLocalMs.toFixed(1)} ms, ratio ${r.ratio.toFixed(2)}`,
    );
  const cross = crossover(rows);
  const top = LENGTHS.at(-1)!;
  console.log(
    cross > top
      ? `disaggregated TTFT never stops losing up to ${top} prompt tokens (busy decode engine) in this run`
      : `disaggregated TTFT stops losing at ~${cross} prompt tokens (busy decode engine): the measured disagg_min_uncached_tokens`,
  );
  results.disagg = {
    backgroundStreams: BACKGROUND,
    rows,
    crossoverTokens: cross,
    served: { disaggregated: remote[0]!.served, local: local[0]!.served },
    loadavg: load(),
  };
}

/** One sample of a Prometheus text exposition (labels as written, e.g. `state="used"`), 0 when absent. */
async function metric(base: string, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const line of text.split("\n")) {
    const m = /^(\w+)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (m && m[1] === name && (labels === "" || (m[2] ?? "").split(",").includes(labels))) return Number(m[3]);
  }
  return 0;
}

/** Shared system prompts: SYSTEMS of them, SYSTEM_TOKENS each (whole 16-token blocks; the embedded model reads 256 tokens). */
const SYSTEMS = 8;
const SYSTEM_TOKENS = 160;
const REPLICA_REQUESTS = Number(process.env.BENCH_ROUTING_REPLICA_REQUESTS ?? 64);
const REQUEST_GAP_MS = 200;

/**
 * The shared-system-prompt workload: request i carries system prompt i % SYSTEMS and a
 * user part of its own, sent to replica ⌊i / SYSTEMS⌋ % replicas (so each system prompt
 * reaches every replica in turn), one every REQUEST_GAP_MS (the traffic of a steady
 * service; the engines beat every BEAT_MS). A hit: the decode engine chosen already held
 * the whole system prompt (its blocks deduplicated, not sent). A first sight: a replica's
 * first request with a system prompt another replica sent before.
 */
async function sharedPrompts(label: string, gateways: number, engineFlags: string[]) {
  const c = await startCluster(2, ["--disagg-min-uncached-tokens", "0"], { gateways, engineFlags });
  try {
    const systemBlocks = SYSTEM_TOKENS / 16;
    const t0 = performance.now();
    const events0 = await metric(c.base, "tl_kv_events_total", 'kind="stored"').then(
      async (x) => x + (await metric(c.base, "tl_kv_events_total", 'kind="removed"')),
    );
    const bytes0 = await metric(c.base, "tl_kv_event_bytes_total");
    const rs: Result[] = [];
    const firstSight: number[] = [];
    const seen = new Set<string>();
    const pending: Promise<void>[] = [];
    for (let i = 0; i < REPLICA_REQUESTS; i++) {
      const system = i % SYSTEMS;
      const replica = Math.floor(i / SYSTEMS) % c.bases.length;
      if (i >= SYSTEMS && !seen.has(`${replica}/${system}`)) firstSight.push(i);
      seen.add(`${replica}/${system}`);
      const tokens = [...prompt(SYSTEM_TOKENS, 100_000 + system), ...prompt(32, 200_000 + i)];
      pending.push(send(c.bases[replica]!, tokens, 4).then((r) => void (rs[i] = r)));
      await Bun.sleep(REQUEST_GAP_MS);
    }
    await Promise.all(pending);
    const seconds = (performance.now() - t0) / 1000;
    const events = (await metric(c.base, "tl_kv_events_total", 'kind="stored"')) + (await metric(c.base, "tl_kv_events_total", 'kind="removed"')) - events0;
    const bytes = (await metric(c.base, "tl_kv_event_bytes_total")) - bytes0;
    for (const r of rs.filter((x) => !x.ok).slice(0, 2)) console.log(`  failed: ${r.error}`);
    // What the processes said last, when something failed (BENCH_LOG_LEVEL=warn says more).
    if (rs.some((x) => !x.ok)) for (const p of [...c.gateways, ...c.decode]) for (const l of p.tail.slice(-3)) console.log(`  ${p.name}: ${l.slice(0, 400)}`);
    const hit = (r: Result) => r.ok && r.blocksDeduped >= systemBlocks;
    const hits = rs.filter(hit).length;
    const firstSightHits = firstSight.filter((i) => hit(rs[i]!)).length;
    const sent = rs.reduce((n, r) => n + r.blocksSent, 0);
    const ok = rs.filter((r) => r.ok).length;
    const row = {
      label,
      gateways,
      requests: REPLICA_REQUESTS,
      ok,
      hits,
      hitRate: hits / (REPLICA_REQUESTS - SYSTEMS),
      firstSight: firstSight.length,
      firstSightHits,
      blocksSent: sent,
      // Seen by replica 0 from both decode engines: what one replica receives.
      eventsPerEnginePerS: events / 2 / seconds,
      eventBytesPerEnginePerS: bytes / 2 / seconds,
      loadavg: load(),
    };
    console.log(
      `  ${label.padEnd(22)} hits ${hits}/${REPLICA_REQUESTS - SYSTEMS} repeats (${row.hitRate.toFixed(2)}), first sight on a replica ${firstSightHits}/${firstSight.length}, blocks sent ${sent}, ok ${ok}/${REPLICA_REQUESTS}` +
        (events > 0 ? `; events ${row.eventsPerEnginePerS.toFixed(1)}/s, ${row.eventBytesPerEnginePerS.toFixed(0)} B/s per engine` : ""),
    );
    return row;
  } finally {
    await c.stop();
  }
}

async function replicas(): Promise<void> {
  console.log(`replicas: ${REPLICA_REQUESTS} requests over ${SYSTEMS} shared system prompts of ${SYSTEM_TOKENS} tokens, one every ${REQUEST_GAP_MS} ms`);
  const only = process.env.BENCH_ROUTING_REPLICA_CONFIGS?.split(",");
  const configs = (
    [
      ["one gateway", 1, []],
      ["2 replicas, events", 2, []],
      ["2 replicas, inferred", 2, ["--kv-events=false"]],
    ] as [string, number, string[]][]
  ).filter(([label]) => only === undefined || only.includes(label));
  const rows: Awaited<ReturnType<typeof sharedPrompts>>[] = [];
  // Alternating rounds: the second runs the configurations in the other order.
  for (const round of [configs, [...configs].reverse()]) for (const [label, n, flags] of round) rows.push(await sharedPrompts(label, n, flags));
  const mean = (label: string, f: (r: (typeof rows)[number]) => number) => {
    const xs = rows.filter((r) => r.label === label).map(f);
    return xs.reduce((a, b) => a + b, 0) / xs.length;
  };
  const single = mean("one gateway", (r) => r.blocksSent);
  const ratios = {
    blocksSentEventsOverOne: mean("2 replicas, events", (r) => r.blocksSent) / single,
    blocksSentInferredOverOne: mean("2 replicas, inferred", (r) => r.blocksSent) / single,
    hitRateEvents: mean("2 replicas, events", (r) => r.hitRate),
    hitRateInferred: mean("2 replicas, inferred", (r) => r.hitRate),
    hitRateOne: mean("one gateway", (r) => r.hitRate),
  };
  console.log(
    `replicas: blocks sent over one gateway's: events ${ratios.blocksSentEventsOverOne.toFixed(2)}× (target ≤ 1.1), inferred ${ratios.blocksSentInferredOverOne.toFixed(2)}×; ` +
      `hit rate events ${ratios.hitRateEvents.toFixed(2)}, inferred ${ratios.hitRateInferred.toFixed(2)}, one gateway ${ratios.hitRateOne.toFixed(2)}`,
  );
  results.replicas = { systems: SYSTEMS, systemTokens: SYSTEM_TOKENS, gapMs: REQUEST_GAP_MS, beatMs: BEAT_MS, rows, ...ratios, loadavg: load() };
}

async function burst2(): Promise<void> {
  const c = await startCluster(2, ["--disagg-min-uncached-tokens", "0"], { gateways: 2 });
  try {
    await send(c.base, prompt(32, -1), 4);
    const rs = await Promise.all(Array.from({ length: 100 }, (_, i) => send(c.bases[i % 2]!, prompt(48, i), 16)));
    const by = new Map<string, number>();
    for (const r of rs) by.set(r.decode, (by.get(r.decode) ?? 0) + 1);
    const busier = Math.max(...by.values()) / rs.length;
    const ok = rs.filter((r) => r.ok).length;
    console.log(
      `burst of 100 over 2 replicas: per decode engine ${JSON.stringify(Object.fromEntries(by))}; busier share ${busier.toFixed(2)} (target ≤ 0.60); ok ${ok}/100`,
    );
    results.burst2 = { requests: 100, replicas: 2, byDecode: Object.fromEntries(by), busierShare: busier, ok, loadavg: load() };
  } finally {
    await c.stop();
  }
}

async function kill(): Promise<void> {
  const c = await startCluster(2, ["--disagg-min-uncached-tokens", "0"], { gateways: 2 });
  try {
    const LOOPS = 4;
    const RUN_MS = 4000;
    const KILL_AT_MS = 1500;
    const t0 = performance.now();
    let killed = false;
    // A client of the killed replica stops at its first failure after the kill (it would go elsewhere).
    const loop = async (base: string, k: number) => {
      const out: Result[] = [];
      for (let i = 0; performance.now() - t0 < RUN_MS; i++) {
        const r = await send(base, prompt(64, k * 10_000 + i), 32);
        out.push(r);
        if (!r.ok && killed) break;
      }
      return out;
    };
    const onA = Array.from({ length: LOOPS }, (_, k) => loop(c.bases[0]!, k));
    const onB = Array.from({ length: LOOPS }, (_, k) => loop(c.bases[1]!, 100 + k));
    await Bun.sleep(KILL_AT_MS);
    c.gateways[1]!.proc.kill("SIGKILL");
    killed = true;
    const killedAt = performance.now();
    const a = (await Promise.all(onA)).flat();
    const b = (await Promise.all(onB)).flat();
    const aOk = a.filter((r) => r.ok).length;
    const bBefore = b.filter((r) => r.ok).length;
    // Back at baseline: no engine holds a used block or a pending handle.
    let baselineMs = NaN;
    const end = performance.now() + 70_000;
    while (performance.now() < end) {
      let busy = 0;
      for (const e of c.engines) busy += (await metric(e, "tl_pool_blocks", 'state="used"')) + (await metric(e, "tl_kv_handles_pending"));
      if (busy === 0) {
        baselineMs = performance.now() - killedAt;
        break;
      }
      await Bun.sleep(50);
    }
    console.log(
      `kill -9 of one replica of two: the other served ${aOk}/${a.length} (target 100%); the killed one ${bBefore} before it died, ${b.length - bBefore} failed (in flight at the kill); ` +
        `every pool and handle at baseline ${baselineMs.toFixed(0)} ms after the kill (beat ${BEAT_MS} ms: 3 beats ${3 * BEAT_MS} ms; handle TTL 60 000 ms)`,
    );
    results.kill = {
      loopsPerReplica: LOOPS,
      runMs: RUN_MS,
      killAtMs: KILL_AT_MS,
      other: { ok: aOk, total: a.length },
      killed: { ok: bBefore, total: b.length },
      baselineMs,
      beatMs: BEAT_MS,
      loadavg: load(),
    };
  } finally {
    await c.stop();
  }
}

/** Heap bytes after a full collection. */
function heap(): number {
  Bun.gc(true);
  return process.memoryUsage().heapUsed;
}

async function memory(): Promise<void> {
  const N = 1_000_000;
  const WORKERS = 8;
  const rnd = () => (BigInt(Math.floor(Math.random() * 2 ** 32)) << 32n) | BigInt(Math.floor(Math.random() * 2 ** 32));
  const hashes = Array.from({ length: N }, rnd);
  const rows: { what: string; bytesPerBlock: number; ms: number }[] = [];
  for (let round = 0; round < 2; round++) {
    for (const what of round === 0 ? ["prefix index", "Map<bigint, true>"] : ["Map<bigint, true>", "prefix index"]) {
      const before = heap();
      const t = performance.now();
      let keep: unknown;
      if (what === "prefix index") {
        const index = new PrefixIndex({ maxBlocks: N });
        const per = N / WORKERS;
        for (let w = 0; w < WORKERS; w++) {
          for (let off = 0, piece = 0; off < per; off += 4096, piece++) {
            const part = hashes.slice(w * per + off, w * per + Math.min(per, off + 4096));
            index.apply(
              `decode-${w}`,
              create(KvEventsSchema, {
                snapshot: true,
                snapshotIndex: piece,
                snapshotLast: off + 4096 >= per,
                firstSeq: 1n,
                epoch: 1n,
                events: [create(KvEventSchema, { hashes: part })],
              }),
            );
          }
        }
        if (index.size !== N) throw new Error(`index holds ${index.size}, want ${N}`);
        keep = index;
      } else {
        // What the gateway kept before events: a Map of bigint hashes per engine (KvAffinity).
        const maps = Array.from({ length: WORKERS }, () => new Map<bigint, true>());
        for (let i = 0; i < N; i++) maps[i % WORKERS]!.set(hashes[i]!, true);
        keep = maps;
      }
      const ms = performance.now() - t;
      const bytes = heap() - before;
      rows.push({ what, bytesPerBlock: bytes / N, ms });
      void keep;
      keep = null;
    }
  }
  const avg = (what: string) => rows.filter((r) => r.what === what).reduce((a, r) => a + r.bytesPerBlock, 0) / 2;
  const idx = avg("prefix index");
  const old = avg("Map<bigint, true>");
  console.log(
    `memory: prefix index with ${N} blocks over ${WORKERS} engines: ${((idx * N) / 2 ** 20).toFixed(1)} MiB (${idx.toFixed(1)} B/block), ` +
      `a Map of bigints ${((old * N) / 2 ** 20).toFixed(1)} MiB (${old.toFixed(1)} B/block); ratio ${(idx / old).toFixed(2)}`,
  );
  results.memory = { blocks: N, engines: WORKERS, rows, prefixIndexBytesPerBlock: idx, bigintMapBytesPerBlock: old, ratio: idx / old, loadavg: load() };
}

if (PARTS.has("burst")) await burst();
if (PARTS.has("freeze")) await freeze();
if (PARTS.has("disagg")) await disagg();
if (PARTS.has("replicas")) await replicas();
if (PARTS.has("burst2")) await burst2();
if (PARTS.has("kill")) await kill();
if (PARTS.has("memory")) await memory();
results.loadavgAtEnd = load();
console.log(`load average at end: ${load().join(" ")}`);
mkdirSync(join(ROOT, "bench/results"), { recursive: true });
// A subset run (BENCH_ROUTING_PARTS) keeps the other parts' last results.
const file = join(ROOT, "bench/results/routing.json");
const previous = existsSync(file) && PARTS.size < ALL_PARTS.split(",").length ? (JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>) : {};
writeFileSync(file, `${JSON.stringify({ ...previous, ...results }, null, 2)}\n`);
