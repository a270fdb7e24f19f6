// Routing under real traffic (issue 14), gateway + 1 prefill + 2 decode engines as
// processes on loopback, the embedded model:
//   1. burst: 100 concurrent streams; the busier decode engine's share (target ≤ 0.6).
//   2. freeze: one decode engine SIGSTOPped; requests arriving after the freeze, their
//      latency over the same requests' latency before it (target ≤ 2×).
//   3. conditional disaggregation: TTFT of prompts of growing length while the decode
//      engine runs other streams, prefilled on P (disaggregated) and on D itself
//      (decode-local); the length where disaggregated TTFT stops losing is the measured
//      default of [gateway] disagg_min_uncached_tokens.
// Writes bench/results/routing.json. Machines are shared: read ratios, and the load printed.
//
//   npx bun bench/routing.ts
//   BENCH_ROUTING_PARTS=burst,freeze,disagg   a subset
import { loadavg } from "node:os";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type RoleProcess, roleArgs, spawnRole } from "../src/cli/spawn-role.ts";
import { sseData } from "../src/http/index.ts";

const ROOT = join(import.meta.dir, "..");
const PARTS = new Set((process.env.BENCH_ROUTING_PARTS ?? "burst,freeze,disagg").split(","));
/** Beats every second: a frozen engine is a beat late (suspect) after 1 s, evicted after 3 s. */
const BEAT_MS = 1000;
const LENGTHS = [16, 32, 64, 128, 256, 512, 1024, 1536];
/** Streams kept running on the decode engine while TTFT is measured: a decode engine at work. */
const BACKGROUND = 8;
/** The freeze part: output tokens per request, and the gap that makes an engine suspect. */
const FREEZE_OUTPUT = Number(process.env.BENCH_ROUTING_FREEZE_OUTPUT ?? 128);
const STALL_MS = 200;

function spawn(name: string, args: string[]): RoleProcess {
  return spawnRole(name, [process.execPath, join(ROOT, "bin/engine.ts"), ...args], { env: { ...process.env, TL_LOG_LEVEL: "error" }, stderr: "tail" });
}

interface Cluster {
  base: string;
  decode: RoleProcess[];
  stop(): Promise<void>;
}

async function startCluster(decodes: number, gatewayFlags: string[]): Promise<Cluster> {
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
  const gw = spawn("gateway", roleArgs("gateway", [...beat, "--routing-headers", ...gatewayFlags]));
  children.push(gw);
  const g = await gw.ready;
  const engine = (role: "prefill" | "decode", id: string) => spawn(id, roleArgs(role, ["--worker-id", id, ...beat, "--gateway-registry", String(g.registry)]));
  const p = engine("prefill", "prefill-0");
  const ds = Array.from({ length: decodes }, (_, i) => engine("decode", `decode-${i}`));
  children.push(p, ...ds);
  try {
    await Promise.all(children.map((c) => c.ready));
    const base = `http://${String(g.http)}`;
    const end = Date.now() + 30_000;
    for (;;) {
      const { workers } = (await (await fetch(`${base}/health`)).json()) as { workers: { decode: number; prefill: number } };
      if (workers.decode === decodes && workers.prefill === 1) break;
      if (Date.now() > end) throw new Error(`engines never registered: ${JSON.stringify(workers)}`);
      await Bun.sleep(50);
    }
    return { base, decode: ds, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

interface Result {
  ok: boolean;
  decode: string;
  served: string;
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
  const r: Result = { ok: false, decode: "", served: "", ttftMs: NaN, totalMs: NaN };
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: tokens, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
    });
    r.decode = res.headers.get("x-tl-decode-worker") ?? "";
    r.served = res.headers.get("x-tl-served") ?? "";
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
const results: Record<string, unknown> = { machine: { cores: navigator.hardwareConcurrency, loadavgAtStart: load() } };
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

if (PARTS.has("burst")) await burst();
if (PARTS.has("freeze")) await freeze();
if (PARTS.has("disagg")) await disagg();
results.loadavgAtEnd = load();
console.log(`load average at end: ${load().join(" ")}`);
mkdirSync(join(ROOT, "bench/results"), { recursive: true });
// A subset run (BENCH_ROUTING_PARTS) keeps the other parts' last results.
const file = join(ROOT, "bench/results/routing.json");
const previous = existsSync(file) && PARTS.size < 3 ? (JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>) : {};
writeFileSync(file, `${JSON.stringify({ ...previous, ...results }, null, 2)}\n`);
