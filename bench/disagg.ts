// Does disaggregation pay (issue 7)? One open-loop workload (Poisson arrivals; long
// prompts with short outputs mixed with short prompts and long outputs; a shared system
// prompt on part of it) against (a) two `both` engines behind the gateway, the baseline,
// and (b) 1 prefill + 1 decode engine behind the gateway, each configuration as separate
// processes on loopback owning the whole machine in turn. Per request rate: TTFT and
// TPOT p50/p99, goodput under a TTFT and a TPOT target taken from a calibration run, KV
// bytes moved and blocks saved by dedup (response headers), and the ratio (b)/(a).
// Writes bench/results/disagg.json and bench/results/disagg.svg.
//
//   npx bun bench/disagg.ts
//   BENCH_DISAGG_SCALE=0.3      shorter (scales the arrival window and the drain cap)
//   BENCH_DISAGG_RATES=1,2      request rates (req/s) to sweep
//   BENCH_DISAGG_REPEAT=2       runs per point, pooled (new arrivals each run)
//   BENCH_DISAGG_MBT=256        max_batch_tokens of every engine (both configurations)
//   BENCH_DISAGG_TTFT_MS / BENCH_DISAGG_TPOT_MS   fixed targets instead of calibrated ones
//   BENCH_DISAGG_TAG=rerun      write disagg.rerun.{json,svg} instead
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type RoleProcess, roleArgs, spawnRole } from "../src/cli/spawn-role.ts";
import { sseData } from "../src/http/index.ts";
import { stream } from "../src/rng/index.ts";

const SCALE = Number(process.env.BENCH_DISAGG_SCALE ?? 1);
const WINDOW_S = 36 * SCALE;
const DRAIN_CAP_S = Math.max(10, 30 * SCALE);
const RATES = (process.env.BENCH_DISAGG_RATES ?? "0.25,0.5,0.75,1,1.5").split(",").map(Number);
const REPEAT = Number(process.env.BENCH_DISAGG_REPEAT ?? 1);
const MBT = Number(process.env.BENCH_DISAGG_MBT ?? 256);
const TAG = process.env.BENCH_DISAGG_TAG ? `.${process.env.BENCH_DISAGG_TAG}` : "";
const ROOT = join(import.meta.dir, "..");
/**
 * Heartbeats share the event loop with the engine step, and the registry drops a worker
 * after 3 silent intervals: at 250 ms a busy prefill engine on a loaded machine was
 * dropped mid-run (503s), and at 1 s still under overload: beat at the engine default.
 */
const BEAT_MS = 2000;

// The workload mix.
const LONG_FRACTION = 0.5;
const LONG_PROMPT = [400, 800] as const;
const LONG_OUTPUT = 8;
const SHORT_PROMPT = [20, 60] as const;
const SHORT_OUTPUT = [64, 128] as const;
/** 12 full blocks of 16 tokens, on this share of the long-prompt requests (inside their length). */
const SYSTEM_TOKENS = 192;
const SYSTEM_FRACTION = 0.5;
// Targets: multiples of what one request alone sees on config (a).
const TTFT_SLACK = 3;
const TPOT_SLACK = 10;

for (const r of RATES) if (!(r > 0)) throw new Error(`BENCH_DISAGG_RATES: want positive rates, got ${process.env.BENCH_DISAGG_RATES}`);
if (!(SCALE > 0) || !(REPEAT >= 1) || !(MBT >= 1)) throw new Error("BENCH_DISAGG_SCALE, _REPEAT and _MBT must be positive");

/** The workload's own PCG32 stream (src/rng), so both configurations get the same requests. */
function prng(seed: number): () => number {
  const r = stream(seed, "bench-disagg");
  return () => r.uniformF64();
}
const between = (rnd: () => number, lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo + 1));

interface Req {
  id: string;
  /** seconds after the start of the run */
  at: number;
  kind: "long" | "short";
  system: boolean;
  prompt: number[];
  maxTokens: number;
  seed: number;
}

const SYSTEM = (() => {
  const rnd = prng(7);
  return Array.from({ length: SYSTEM_TOKENS }, () => Math.floor(rnd() * 256));
})();

function request(rnd: () => number, id: string, at: number, kind?: "long" | "short", len?: number): Req {
  const k = kind ?? (rnd() < LONG_FRACTION ? "long" : "short");
  const n = len ?? (k === "long" ? between(rnd, ...LONG_PROMPT) : between(rnd, ...SHORT_PROMPT));
  const system = k === "long" && rnd() < SYSTEM_FRACTION;
  const prompt = system ? [...SYSTEM] : [];
  // Byte ids only (0..255): no BOS or EOS inside a prompt.
  while (prompt.length < n) prompt.push(Math.floor(rnd() * 256));
  const maxTokens = k === "long" ? LONG_OUTPUT : between(rnd, ...SHORT_OUTPUT);
  return { id, at, kind: k, system, prompt, maxTokens, seed: Math.floor(rnd() * 2 ** 31) };
}

/** Poisson arrivals at `rate` over the window; the same list for both configurations. */
function workload(rate: number, seed: number): Req[] {
  const rnd = prng(seed);
  const out: Req[] = [];
  let t = 0;
  for (;;) {
    t += -Math.log(1 - rnd()) / rate;
    if (t >= WINDOW_S) return out;
    out.push(request(rnd, `r${rate}-s${seed}-${out.length}`, t));
  }
}

// ---- processes ----------------------------------------------------------------------

type Child = RoleProcess;

/** Every process on tl-synthetic-4l (its context and pace are what the bench's loads are sized for), not the default. */
function spawn(name: string, args: string[]): Child {
  return spawnRole(name, [process.execPath, join(ROOT, "bin/engine.ts"), ...args, "--model", "tl-synthetic-4l"], {
    env: { ...process.env, TL_LOG_LEVEL: "warn" },
    stderr: "tail",
  });
}

type ConfigName = "a" | "b";
const CONFIGS: Record<ConfigName, { label: string; roles: ("both" | "prefill" | "decode")[] }> = {
  a: { label: "(a) 2 x both", roles: ["both", "both"] },
  b: { label: "(b) 1 prefill + 1 decode", roles: ["prefill", "decode"] },
};

interface Cluster {
  base: string;
  children: Child[];
  stop(): Promise<void>;
}

async function startCluster(cfg: ConfigName): Promise<Cluster> {
  const children: Child[] = [];
  const stop = async () => {
    for (const c of children) c.proc.kill("SIGTERM");
    await Promise.all(children.map((c) => Promise.race([c.proc.exited, Bun.sleep(5000).then(() => c.proc.kill("SIGKILL"))])));
  };
  try {
    const gw = spawn("gateway", roleArgs("gateway", ["--heartbeat-interval-ms", String(BEAT_MS)]));
    children.push(gw);
    const g = await gw.ready;
    const roles = CONFIGS[cfg].roles;
    roles.forEach((role, i) =>
      children.push(
        spawn(
          `${role}-${i}`,
          roleArgs(role, [
            "--worker-id",
            `${role}-${i}`,
            "--gateway-registry",
            String(g.registry),
            "--heartbeat-interval-ms",
            String(BEAT_MS),
            "--max-batch-tokens",
            String(MBT),
            "--drain-timeout-s",
            "2",
          ]),
        ),
      ),
    );
    await Promise.all(children.map((c) => c.ready));
    const base = `http://${String(g.http)}`;
    const want = {
      prefill: roles.filter((r) => r === "prefill").length,
      decode: roles.filter((r) => r === "decode").length,
      both: roles.filter((r) => r === "both").length,
    };
    const deadline = Date.now() + 30_000;
    for (;;) {
      const h = (await (await fetch(`${base}/health`)).json()) as { workers: typeof want };
      if (h.workers.prefill === want.prefill && h.workers.decode === want.decode && h.workers.both === want.both) break;
      if (Date.now() > deadline) throw new Error(`registry lists ${JSON.stringify(h.workers)}, want ${JSON.stringify(want)}`);
      await Bun.sleep(50);
    }
    return { base, children, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

// ---- the client ---------------------------------------------------------------------

interface Outcome {
  id: string;
  kind: "long" | "short";
  ok: boolean;
  error?: string;
  /** ms from scheduled arrival to the first token chunk; for a request that never got one, the time until it was given up (censored) */
  ttftMs: number;
  gotFirst: boolean;
  /** ms per output token after the first; null with fewer than 2 tokens */
  tpotMs: number | null;
  /** the largest gap between two tokens (ms) */
  maxGapMs: number;
  tokens: number;
  /** FNV-1a of the token ids: seeded output must not depend on the configuration */
  digest: string;
  served: string;
  blocksSent: number;
  blocksDeduped: number;
  payloadBytes: number;
}

function digest(ids: number[]): string {
  let h = 0x811c9dc5;
  for (const t of ids) h = Math.imul(h ^ t, 0x01000193) >>> 0;
  return h.toString(16);
}

async function send(base: string, r: Req, t0: number, signal: AbortSignal): Promise<Outcome> {
  const due = t0 + r.at * 1000;
  const ids: number[] = [];
  const stamps: number[] = [];
  const out: Outcome = {
    id: r.id,
    kind: r.kind,
    ok: false,
    ttftMs: 0,
    gotFirst: false,
    tpotMs: null,
    maxGapMs: 0,
    tokens: 0,
    digest: "",
    served: "",
    blocksSent: 0,
    blocksDeduped: 0,
    payloadBytes: 0,
  };
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": r.id },
      body: JSON.stringify({ prompt: r.prompt, max_tokens: r.maxTokens, temperature: 0.8, seed: r.seed, stream: true, return_token_ids: true }),
      signal,
    });
    const h = res.headers;
    out.served = h.get("x-tl-served") ?? "";
    out.blocksSent = Number(h.get("x-tl-blocks-sent") ?? 0);
    out.blocksDeduped = Number(h.get("x-tl-blocks-deduped") ?? 0);
    out.payloadBytes = Number(h.get("x-tl-payload-bytes") ?? 0);
    if (res.status !== 200) throw new Error(`status ${res.status}: ${(await res.text()).slice(0, 200)}`);
    let done = false;
    for await (const data of sseData(res.body!)) {
      const now = performance.now();
      if (data === "[DONE]") {
        done = true;
        continue;
      }
      const obj = JSON.parse(data) as { error?: { message?: string }; choices?: { token_ids?: number[] }[] };
      if (obj.error) throw new Error(obj.error.message ?? "error event");
      for (const c of obj.choices ?? []) {
        for (const t of c.token_ids ?? []) {
          ids.push(t);
          stamps.push(now);
        }
      }
    }
    if (!done) throw new Error("stream ended without [DONE]");
    out.ok = ids.length > 0;
    if (!out.ok) out.error = "no tokens";
  } catch (e) {
    out.error = signal.aborted ? "given up after the drain cap" : e instanceof Error ? e.message : String(e);
  }
  out.tokens = ids.length;
  out.digest = digest(ids);
  out.gotFirst = stamps.length > 0;
  out.ttftMs = (out.gotFirst ? stamps[0]! : performance.now()) - due;
  if (out.ok && stamps.length > 1) out.tpotMs = (stamps.at(-1)! - stamps[0]!) / (stamps.length - 1);
  for (let i = 1; i < stamps.length; i++) out.maxGapMs = Math.max(out.maxGapMs, stamps[i]! - stamps[i - 1]!);
  return out;
}

/** Fires the requests at their scheduled times without waiting for answers (open loop). */
async function runLoad(base: string, reqs: Req[]): Promise<{ outcomes: Outcome[]; lateMs: number }> {
  const abort = new AbortController();
  const t0 = performance.now() + 50;
  const pending: Promise<Outcome>[] = [];
  let lateMs = 0;
  for (const r of reqs) {
    const wait = t0 + r.at * 1000 - performance.now();
    if (wait > 1) await Bun.sleep(wait);
    lateMs = Math.max(lateMs, performance.now() - (t0 + r.at * 1000));
    pending.push(send(base, r, t0, abort.signal));
  }
  const cap = setTimeout(() => abort.abort(), DRAIN_CAP_S * 1000);
  const outcomes = await Promise.all(pending);
  clearTimeout(cap);
  return { outcomes, lateMs };
}

// ---- statistics ---------------------------------------------------------------------

function pct(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

interface Targets {
  ttftMs: number;
  tpotMs: number;
  how: string;
}

interface Point {
  config: ConfigName;
  rate: number;
  requests: number;
  windowS: number;
  ok: number;
  failed: number;
  good: number;
  goodput: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
  tpotP50Ms: number;
  tpotP99Ms: number;
  /** p99 of each request's largest inter-token gap: the stalls a reader sees */
  maxGapP99Ms: number;
  shortTpotP99Ms: number;
  longTtftP50Ms: number;
  blocksSent: number;
  blocksDeduped: number;
  kvBytes: number;
  kvBytesSavedByDedup: number;
  served: Record<string, number>;
  clientLateMs: number;
  errors: string[];
}

function summarize(config: ConfigName, rate: number, runs: { outcomes: Outcome[]; lateMs: number }[], t: Targets): Point {
  const all = runs.flatMap((r) => r.outcomes);
  const ok = all.filter((o) => o.ok);
  const tpots = ok.flatMap((o) => (o.tpotMs === null ? [] : [o.tpotMs]));
  // TTFT over every request: one that never got a token counts with the time it waited.
  const ttfts = all.map((o) => o.ttftMs);
  const good = ok.filter((o) => o.ttftMs <= t.ttftMs && (o.tpotMs === null || o.tpotMs <= t.tpotMs)).length;
  const blocksSent = ok.reduce((s, o) => s + o.blocksSent, 0);
  const kvBytes = ok.reduce((s, o) => s + o.payloadBytes, 0);
  const blocksDeduped = ok.reduce((s, o) => s + o.blocksDeduped, 0);
  const served: Record<string, number> = {};
  for (const o of all) served[o.served || "none"] = (served[o.served || "none"] ?? 0) + 1;
  const errs = [...new Set(all.flatMap((o) => (o.ok ? [] : [o.error ?? "?"])))].slice(0, 5);
  const windowS = WINDOW_S * runs.length;
  return {
    config,
    rate,
    requests: all.length,
    windowS,
    ok: ok.length,
    failed: all.length - ok.length,
    good,
    goodput: good / windowS,
    ttftP50Ms: pct(ttfts, 50),
    ttftP99Ms: pct(ttfts, 99),
    tpotP50Ms: pct(tpots, 50),
    tpotP99Ms: pct(tpots, 99),
    maxGapP99Ms: pct(
      ok.filter((o) => o.tokens > 1).map((o) => o.maxGapMs),
      99,
    ),
    shortTpotP99Ms: pct(
      ok.filter((o) => o.kind === "short" && o.tpotMs !== null).map((o) => o.tpotMs!),
      99,
    ),
    longTtftP50Ms: pct(
      all.filter((o) => o.kind === "long").map((o) => o.ttftMs),
      50,
    ),
    blocksSent,
    blocksDeduped,
    kvBytes,
    // Deduped blocks would have cost what a sent block costs.
    kvBytesSavedByDedup: blocksSent > 0 ? Math.round((kvBytes / blocksSent) * blocksDeduped) : 0,
    served,
    clientLateMs: Math.max(...runs.map((r) => r.lateMs)),
    errors: errs,
  };
}

// ---- calibration --------------------------------------------------------------------

interface Unloaded {
  longTtftMs: number;
  shortTtftMs: number;
  tpotMs: number;
}

/** One request at a time: the latencies no queueing or interference adds to. */
async function unloaded(cfg: ConfigName): Promise<Unloaded> {
  const c = await startCluster(cfg);
  try {
    const rnd = prng(99);
    const seq = async (reqs: Req[]) => {
      const out: Outcome[] = [];
      for (const r of reqs) out.push(await send(c.base, { ...r, at: 0 }, performance.now(), new AbortController().signal));
      for (const o of out) if (!o.ok) throw new Error(`calibration request ${o.id} failed: ${o.error}`);
      return out;
    };
    await seq([request(rnd, "warm-0", 0, "long", 400), request(rnd, "warm-1", 0, "short", 40)]);
    // No shared prefix on these: the worst prompt of the mix, computed in full.
    const longs = await seq(
      Array.from({ length: 4 }, (_, i) => ({ ...request(rnd, `cal-long-${i}`, 0, "short", LONG_PROMPT[1]), kind: "long" as const, maxTokens: LONG_OUTPUT })),
    );
    const shorts = await seq(
      Array.from({ length: 4 }, (_, i) => ({ ...request(rnd, `cal-short-${i}`, 0, "short", SHORT_PROMPT[1]), maxTokens: SHORT_OUTPUT[1] })),
    );
    return {
      longTtftMs: pct(
        longs.map((o) => o.ttftMs),
        50,
      ),
      shortTtftMs: pct(
        shorts.map((o) => o.ttftMs),
        50,
      ),
      tpotMs: pct(
        shorts.flatMap((o) => (o.tpotMs === null ? [] : [o.tpotMs])),
        50,
      ),
    };
  } finally {
    await c.stop();
  }
}

/** Targets from config (a) unloaded; (b) unloaded is measured too, to show what the hand-off costs. */
async function calibrate(): Promise<Targets & { unloaded: Record<ConfigName, Unloaded> }> {
  const a = await unloaded("a");
  const b = await unloaded("b");
  const fixedTtft = process.env.BENCH_DISAGG_TTFT_MS ? Number(process.env.BENCH_DISAGG_TTFT_MS) : null;
  const fixedTpot = process.env.BENCH_DISAGG_TPOT_MS ? Number(process.env.BENCH_DISAGG_TPOT_MS) : null;
  return {
    ttftMs: fixedTtft ?? Math.round(TTFT_SLACK * a.longTtftMs),
    tpotMs: fixedTpot ?? Math.round(TPOT_SLACK * a.tpotMs * 10) / 10,
    how:
      `TTFT target ${fixedTtft !== null ? "from BENCH_DISAGG_TTFT_MS" : `= ${TTFT_SLACK} x unloaded TTFT of a ${LONG_PROMPT[1]}-token prompt`}, ` +
      `TPOT target ${fixedTpot !== null ? "from BENCH_DISAGG_TPOT_MS" : `= ${TPOT_SLACK} x unloaded TPOT of one ${SHORT_OUTPUT[1]}-token stream`} (one request at a time on config (a))`,
    unloaded: { a, b },
  };
}

// ---- the chart ----------------------------------------------------------------------

function svgChart(points: Point[], t: Targets): string {
  const W = 920,
    H = 380,
    M = { l: 64, r: 16, t: 44, b: 52 },
    GAP = 70;
  const pw = (W - M.l - M.r - GAP) / 2,
    ph = H - M.t - M.b;
  const rates = [...new Set(points.map((p) => p.rate))].sort((a, b) => a - b);
  const xMax = Math.max(...rates) * 1.05;
  const color = { a: "#d62728", b: "#1f77b4" };
  const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");
  const panel = (x0: number, title: string, key: "ttftP99Ms" | "tpotP99Ms", target: number) => {
    const vals = points.map((p) => p[key]).filter((v) => Number.isFinite(v) && v > 0);
    // Log scale: overload sends TTFT up by orders of magnitude.
    const lo = Math.pow(10, Math.floor(Math.log10(Math.min(target, ...vals))));
    const hi = Math.pow(10, Math.ceil(Math.log10(Math.max(target, ...vals) * 1.01)));
    const X = (r: number) => x0 + (r / xMax) * pw;
    const Y = (v: number) => M.t + ph - ((Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * ph;
    const parts: string[] = [];
    parts.push(`<rect x="${x0}" y="${M.t}" width="${pw}" height="${ph}" fill="none" stroke="#999"/>`);
    parts.push(`<text x="${x0 + pw / 2}" y="${M.t - 10}" text-anchor="middle" font-weight="bold">${esc(title)}</text>`);
    for (let d = lo; d <= hi * 1.0001; d *= 10) {
      for (const m of [1, 2, 5]) {
        const v = d * m;
        if (v > hi * 1.0001) break;
        parts.push(`<line x1="${x0}" x2="${x0 + pw}" y1="${Y(v).toFixed(1)}" y2="${Y(v).toFixed(1)}" stroke="#eee"/>`);
        parts.push(`<text x="${x0 - 6}" y="${(Y(v) + 4).toFixed(1)}" text-anchor="end" font-size="11">${v >= 1000 ? `${v / 1000}s` : `${v}ms`}</text>`);
      }
    }
    for (const r of rates) {
      parts.push(`<line x1="${X(r).toFixed(1)}" x2="${X(r).toFixed(1)}" y1="${M.t + ph}" y2="${M.t + ph + 4}" stroke="#999"/>`);
      parts.push(`<text x="${X(r).toFixed(1)}" y="${M.t + ph + 17}" text-anchor="middle" font-size="11">${r}</text>`);
    }
    parts.push(`<text x="${x0 + pw / 2}" y="${M.t + ph + 36}" text-anchor="middle" font-size="12">request rate (req/s)</text>`);
    parts.push(`<line x1="${x0}" x2="${x0 + pw}" y1="${Y(target).toFixed(1)}" y2="${Y(target).toFixed(1)}" stroke="#2ca02c" stroke-dasharray="6 4"/>`);
    parts.push(`<text x="${x0 + pw - 4}" y="${(Y(target) - 5).toFixed(1)}" text-anchor="end" font-size="11" fill="#2ca02c">target ${target}ms</text>`);
    for (const cfg of ["a", "b"] as const) {
      const ps = points.filter((p) => p.config === cfg && Number.isFinite(p[key]) && p[key] > 0).sort((a, b) => a.rate - b.rate);
      if (ps.length === 0) continue;
      parts.push(
        `<polyline fill="none" stroke="${color[cfg]}" stroke-width="2" points="${ps.map((p) => `${X(p.rate).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" ")}"/>`,
      );
      for (const p of ps)
        parts.push(
          `<circle cx="${X(p.rate).toFixed(1)}" cy="${Y(p[key]).toFixed(1)}" r="3.5" fill="${color[cfg]}"><title>${esc(CONFIGS[cfg].label)} @ ${p.rate} req/s: ${p[key].toFixed(1)} ms</title></circle>`,
        );
    }
    return parts.join("\n");
  };
  const legend = (["a", "b"] as const)
    .map(
      (cfg, i) =>
        `<line x1="${M.l + i * 240}" x2="${M.l + i * 240 + 24}" y1="${H - 10}" y2="${H - 10}" stroke="${color[cfg]}" stroke-width="2"/><text x="${M.l + i * 240 + 30}" y="${H - 6}" font-size="12">${esc(CONFIGS[cfg].label)}</text>`,
    )
    .join("\n");
  return `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">
<rect width="${W}" height="${H}" fill="white"/>
<text x="${W / 2}" y="16" text-anchor="middle" font-size="13">tl-engine disaggregation bench: p99 latency against request rate (tl-synthetic-4l, 2 cores, max_batch_tokens ${MBT})</text>
${panel(M.l, "TTFT p99", "ttftP99Ms", t.ttftMs)}
${panel(M.l + pw + GAP, "TPOT p99", "tpotP99Ms", t.tpotMs)}
${legend}
</svg>
`;
}

// ---- main ---------------------------------------------------------------------------

const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "-");
const f0 = (v: number) => (Number.isFinite(v) ? v.toFixed(0) : "-");
const started = performance.now();
console.log(
  `disagg bench: rates ${RATES.join(", ")} req/s, ${WINDOW_S}s of arrivals per point x ${REPEAT}, max_batch_tokens ${MBT}, drain cap ${DRAIN_CAP_S}s`,
);
const targets = await calibrate();
for (const cfg of ["a", "b"] as const) {
  const u = targets.unloaded[cfg];
  console.log(
    `calibration, one request at a time on ${CONFIGS[cfg].label}: ${LONG_PROMPT[1]}-token prompt TTFT ${f0(u.longTtftMs)} ms, ${SHORT_PROMPT[1]}-token prompt TTFT ${f0(u.shortTtftMs)} ms, TPOT ${f1(u.tpotMs)} ms`,
  );
}
console.log(`targets: TTFT <= ${targets.ttftMs} ms and TPOT <= ${targets.tpotMs} ms (${targets.how})`);

const points: Point[] = [];
const mismatches: { id: string; a: string; b: string }[] = [];
/** Per request [kind, ttft ms, tpot ms | null, tokens, ok], to recompute goodput under other targets. */
const raw: { config: ConfigName; rate: number; requests: [string, number, number | null, number, boolean][] }[] = [];
for (const rate of RATES) {
  const runs: Record<ConfigName, { outcomes: Outcome[]; lateMs: number }[]> = { a: [], b: [] };
  for (let rep = 0; rep < REPEAT; rep++) {
    const reqs = workload(rate, 1000 + rep);
    // (a) then (b) back to back, so drift in the machine's background load hits both alike.
    for (const cfg of ["a", "b"] as const) {
      const c = await startCluster(cfg);
      try {
        runs[cfg].push(await runLoad(c.base, reqs));
      } finally {
        await c.stop();
      }
    }
    const byId = new Map(runs.a.at(-1)!.outcomes.map((o) => [o.id, o]));
    for (const ob of runs.b.at(-1)!.outcomes) {
      const oa = byId.get(ob.id)!;
      if (oa.ok && ob.ok && oa.digest !== ob.digest) mismatches.push({ id: ob.id, a: oa.digest, b: ob.digest });
    }
  }
  for (const cfg of ["a", "b"] as const) {
    const rows = runs[cfg]
      .flatMap((r) => r.outcomes)
      .map(
        (o) =>
          [o.kind, Math.round(o.ttftMs), o.tpotMs === null ? null : Math.round(o.tpotMs * 100) / 100, o.tokens, o.ok] as [
            string,
            number,
            number | null,
            number,
            boolean,
          ],
      );
    raw.push({ config: cfg, rate, requests: rows });
  }
  const pa = summarize("a", rate, runs.a, targets);
  const pb = summarize("b", rate, runs.b, targets);
  points.push(pa, pb);
  for (const p of [pa, pb]) {
    console.log(
      `  ${String(rate).padStart(4)} req/s ${CONFIGS[p.config].label.padEnd(26)} n=${p.requests} ok=${p.ok} ` +
        `TTFT p50/p99 ${f0(p.ttftP50Ms)}/${f0(p.ttftP99Ms)} ms  TPOT p50/p99 ${f1(p.tpotP50Ms)}/${f1(p.tpotP99Ms)} ms  max-gap p99 ${f0(p.maxGapP99Ms)} ms  ` +
        `goodput ${p.goodput.toFixed(2)} req/s (${p.good}/${p.requests})  KV ${(p.kvBytes / 1e6).toFixed(1)} MB sent, ${p.blocksDeduped} blocks deduped (${(p.kvBytesSavedByDedup / 1e6).toFixed(1)} MB saved)` +
        (p.errors.length ? `  errors: ${p.errors.join(" | ")}` : ""),
    );
  }
  console.log(
    `  ${String(rate).padStart(4)} req/s ratio (b)/(a): goodput ${(pb.goodput / pa.goodput).toFixed(2)}x, TPOT p99 ${(pb.tpotP99Ms / pa.tpotP99Ms).toFixed(2)}x, TTFT p99 ${(pb.ttftP99Ms / pa.ttftP99Ms).toFixed(2)}x`,
  );
}

const ratios = RATES.map((rate) => {
  const a = points.find((p) => p.config === "a" && p.rate === rate)!;
  const b = points.find((p) => p.config === "b" && p.rate === rate)!;
  return { rate, goodput: b.goodput / a.goodput, tpotP99: b.tpotP99Ms / a.tpotP99Ms, ttftP99: b.ttftP99Ms / a.ttftP99Ms };
});
console.log("\n rate | goodput a   b   (b)/(a) | TPOT p99 a     b   (b)/(a) | TTFT p99 a     b   (b)/(a) | short-prompt TPOT p99 a   b");
for (const r of ratios) {
  const a = points.find((p) => p.config === "a" && p.rate === r.rate)!;
  const b = points.find((p) => p.config === "b" && p.rate === r.rate)!;
  console.log(
    ` ${String(r.rate).padStart(4)} | ${a.goodput.toFixed(2).padStart(9)} ${b.goodput.toFixed(2).padStart(4)} ${r.goodput.toFixed(2).padStart(6)}x | ` +
      `${f1(a.tpotP99Ms).padStart(8)} ${f1(b.tpotP99Ms).padStart(6)} ${r.tpotP99.toFixed(2).padStart(6)}x | ${f0(a.ttftP99Ms).padStart(8)} ${f0(b.ttftP99Ms).padStart(6)} ${r.ttftP99.toFixed(2).padStart(6)}x | ${f1(a.shortTpotP99Ms).padStart(19)} ${f1(b.shortTpotP99Ms).padStart(5)}`,
  );
}
if (mismatches.length > 0)
  console.log(`WARNING: ${mismatches.length} seeded requests gave different tokens in (a) and (b), e.g. ${JSON.stringify(mismatches[0])}`);
else console.log("seeded outputs: identical in (a) and (b) for every request both completed");

const dir = join(ROOT, "bench/results");
mkdirSync(dir, { recursive: true });
writeFileSync(
  join(dir, `disagg${TAG}.json`),
  JSON.stringify(
    {
      bench: "disagg",
      baseline: "(a) two `both` engines behind the gateway (colocated)",
      configs: CONFIGS,
      machine: { cpus: navigator.hardwareConcurrency, bun: Bun.version },
      workload: {
        arrivals: "Poisson",
        windowS: WINDOW_S,
        repeat: REPEAT,
        drainCapS: DRAIN_CAP_S,
        longFraction: LONG_FRACTION,
        long: { promptTokens: LONG_PROMPT, outputTokens: LONG_OUTPUT, sharedSystemPromptTokens: SYSTEM_TOKENS, sharedSystemPromptFraction: SYSTEM_FRACTION },
        short: { promptTokens: SHORT_PROMPT, outputTokens: SHORT_OUTPUT },
        sampling: "temperature 0.8, per-request seed (EOS may end a stream early; identically in both configurations)",
        maxBatchTokens: MBT,
      },
      targets,
      points,
      ratios,
      seededOutputMismatches: mismatches.length,
      raw,
      elapsedS: Math.round((performance.now() - started) / 1000),
    },
    null,
    2,
  ) + "\n",
);
writeFileSync(join(dir, `disagg${TAG}.svg`), svgChart(points, targets));
console.log(`wrote bench/results/disagg${TAG}.json and disagg${TAG}.svg (${Math.round((performance.now() - started) / 1000)} s)`);
