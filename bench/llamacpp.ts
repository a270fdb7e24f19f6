// tl-engine against llama.cpp on the same GGUF files, the same thread count, in alternating
// rounds (issue 25). The baseline is llama.cpp's own tools, built from the source node-llama-cpp
// 3.21.1 bundles (bench/llamacpp-build.ts): `llama-bench -t N -p 512 -n 128 -r 1 -o json` for
// prefill of 512 tokens and batch-1 decode of 128, and `llama-batched-bench -npp 128 -ntg 128
// -npl 8` for 8 concurrent sequences. Ours runs in a child process per attempt (bun, the
// engine's own path: loadModel with its model thread, the KV pool, Engine.submit), on the same
// file with `threads` = N:
//   decode  : an 8-token prompt, 128 greedy tokens after the first (EOS ignored), tok/s (after
//             a warm-up of 16 tokens, as llama-bench generates one before timing: an 8B Q4_K_M's
//             first 32 tokens after the load decoded at 0.76-0.90x of the next 64's in four runs,
//             JavaScriptCore's optimizing tier and the first pass over the weights among them)
//   prefill : a 512-token prompt to its first token, tok/s (after a warm-up prompt of the same
//             length, as llama-bench runs its whole prompt once before timing it: it also gives
//             JavaScriptCore's optimizing tier the kernels' 512-row paths on every thread)
//   batch 8 : 8 distinct 128-token prompts submitted at once, 128 tokens each after the first;
//             decode tok/s over all 8 (llama-batched-bench's S_TG) and overall (its S)
// beside load time (ours: loadModel until the model thread is ready; llama.cpp: the "load
// time" llama-batched-bench prints, from the model's load to its first evaluation) and peak RSS (ours: the child's VmHWM; llama.cpp: /usr/bin/time's
// maximum resident set size of each tool). GB/s is the file's weight bytes one decoded token
// reads (every tensor but the embedding rows; a tied embedding counted once, as classifier)
// times decode tok/s. Each of our attempts has a timeout (TIMEOUT_S): a phase that does not
// finish is reported as timed out with the rate it had reached, and the phases after it are
// run in a new child, so a type we cannot serve fast (widened to f32) never hangs the bench.
//
//   SIZES=135m,1b TYPES=f16,q8_0,q4_k_m,q4_0 ROUNDS=3 THREADS=2 bun bench/llamacpp.ts
//   SIZES=8b TYPES=q4_k_m ...     (8B files, 16 GB at F16, only when asked)
//   PHASES=decode ROUNDS=6 ...    (some of the phases only: more rounds in the time)
//
// Model files are cached under TL_LLAMACPP_CACHE/models (default ~/.cache/tl-engine/llamacpp).
// JSON goes to bench/results/llamacpp.json (OUT=name for llamacpp.<name>.json).
import { spawn, spawnSync } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, statfsSync, statSync, writeFileSync } from "node:fs";
import { availableParallelism, cpus } from "node:os";
import { join } from "node:path";
import { cacheDir, ensureLlamaCpp, type LlamaCppBuild } from "./llamacpp-build.ts";
import { BOS_ID, SHAPES, shapeHeader, writeShapeGguf } from "./gguf-shapes.ts";
import { loadAverage, median } from "./stats.ts";
import { kvPoolFor, loadModel } from "../src/cli/engine-node.ts";
import { Engine } from "../src/engine/index.ts";
import { ggmlTypeName, parseGguf } from "../src/model/load/gguf.ts";

/** llama-quantize's names for the types asked by TYPES (f16 is written directly). */
const QUANT_NAMES: Record<string, string> = { f16: "F16", q8_0: "Q8_0", q4_k_m: "Q4_K_M", q4_0: "Q4_0", q6_k: "Q6_K", q5_k_m: "Q5_K_M", bf16: "BF16" };
const PHASES = ["decode", "prefill", "batch"] as const;
type Phase = (typeof PHASES)[number];
/**
 * The phases to run (PHASES=decode: both sides run only the decode, llama-bench with -p 0, so
 * many alternating rounds fit where the host is noisy; its load time comes from batched-bench
 * and is then left out).
 */
const ASKED: Phase[] = (process.env.PHASES ?? PHASES.join(",")).split(",").map((p) => {
  const ph = p.trim() as Phase;
  if (!PHASES.includes(ph)) throw new Error(`PHASES: ${p} is not one of ${PHASES.join(", ")}`);
  return ph;
});
const PREFILL = 512;
const DECODE = 128;
// llama-batched-bench's -npl/-npp/-ntg; the children read the same environment.
const BATCH = Number(process.env.BATCH ?? 8);
const BATCH_PP = Number(process.env.BATCH_PP ?? 128);
const BATCH_TG = Number(process.env.BATCH_TG ?? 128);

// ---------------------------------------------------------------------------------------------
// Our side: the child

interface Tick {
  phase: Phase;
  tokens: number;
  ms: number;
}

function vmHwm(): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}

/** Token ids of the padding range (never BOS/EOS/bytes), from a seeded stream: distinct prompts, no prefix-cache hits. */
function promptOf(n: number, vocab: number, seed: number): number[] {
  let x = seed >>> 0 || 1;
  const out: number[] = [BOS_ID];
  while (out.length < n) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out.push(258 + ((x >>> 0) % (vocab - 258)));
  }
  return out;
}

async function child(file: string, threads: number, phases: Phase[]): Promise<void> {
  const say = (o: object) => process.stdout.write(`${JSON.stringify(o)}\n`);
  const t0 = performance.now();
  // As `engine generate` and every role load it: the weights as stored (its --dtype default), on a model thread.
  const model = await loadModel({ modelPath: file, maxSeqLen: 1024, threads, dtype: "as-stored", modelThread: "worker" });
  say({ event: "loaded", loadMs: performance.now() - t0, rss: vmHwm(), dtype: model.dtype ?? null, residentBytes: model.stats?.residentBytes ?? null });
  const vocab = model.tokenizer.vocabSize;
  const B = 16;
  const pool = await kvPoolFor(
    model,
    { blockTokens: B, nLayers: model.nLayers, nKvHeads: model.nKvHeads, headDim: model.headDim },
    Math.ceil((BATCH * (BATCH_PP + BATCH_TG + 1)) / B) + 2 * BATCH + 8,
  );
  const engine = new Engine({ model: model.runner, pool, maxModelLen: 1024, maxBatchTokens: BATCH * BATCH_PP, eosTokenIds: model.eosIds });
  const greedy = (maxTokens: number) => ({ temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens, stopTokenIds: [], ignoreEos: true });
  let id = 0;
  const run = (prompt: number[], maxTokens: number, onToken?: (t: number) => void) =>
    engine.submit({ requestId: `r${id++}`, promptTokens: prompt, sampling: greedy(maxTokens), onToken: onToken ?? (() => {}) });
  for (const phase of phases) {
    if (phase === "decode") {
      await run(promptOf(8, vocab, 10), 16);
      let first = 0;
      let n = 0;
      await run(promptOf(8, vocab, 11), DECODE + 1, () => {
        const now = performance.now();
        if (n++ === 0) first = now;
        else say({ event: "tick", phase, tokens: n - 1, ms: now - first });
      });
      const ms = performance.now() - first;
      say({ event: "done", phase, tokPerS: (DECODE / ms) * 1000, ms, rss: vmHwm() });
    } else if (phase === "prefill") {
      await run(promptOf(PREFILL, vocab, 12), 1);
      const t = performance.now();
      await run(promptOf(PREFILL, vocab, 13), 1);
      const ms = performance.now() - t;
      say({ event: "done", phase, tokPerS: (PREFILL / ms) * 1000, ms, rss: vmHwm() });
    } else {
      const t = performance.now();
      let firsts = 0;
      let lastFirst = 0;
      let decoded = 0;
      const seen = new Array<number>(BATCH).fill(0);
      await Promise.all(
        Array.from({ length: BATCH }, (_, j) =>
          run(promptOf(BATCH_PP, vocab, 100 + j), BATCH_TG + 1, () => {
            const now = performance.now();
            if (seen[j]!++ === 0) {
              firsts++;
              lastFirst = now;
            } else {
              decoded++;
              if (decoded % BATCH === 0) say({ event: "tick", phase, tokens: decoded, ms: now - t });
            }
          }),
        ),
      );
      const end = performance.now();
      say({
        event: "done",
        phase,
        // decode over all sequences once all have their first token (llama-batched-bench's S_TG), and everything (its S)
        tokPerS: firsts === BATCH ? ((BATCH * BATCH_TG) / (end - lastFirst)) * 1000 : 0,
        allTokPerS: ((BATCH * (BATCH_PP + BATCH_TG)) / (end - t)) * 1000,
        prefillTokPerS: ((BATCH * BATCH_PP) / (lastFirst - t)) * 1000,
        ms: end - t,
        rss: vmHwm(),
      });
    }
  }
  model.close?.();
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------
// The parent

interface OursPhase {
  tokPerS: number | null;
  /** Set when the phase ran out of time: what it had reached. */
  timedOut?: { afterS: number; tokens: number; tokPerS: number | null };
  error?: string;
  allTokPerS?: number;
  prefillTokPerS?: number;
}

interface OursRun {
  loadMs: number[];
  rss: number;
  dtype: string | null;
  residentBytes: number | null;
  phases: Partial<Record<Phase, OursPhase>>;
}

/** The line of a child's stderr that says what failed (Bun prints the message before the stack), else its last lines. */
function errorLine(stderr: string): string {
  const lines = stderr.trim().split("\n");
  return lines.find((l) => /^(error|\w*Error)\b/.test(l.trim())) ?? lines.slice(-3).join(" | ");
}

/** Runs the phases in children, a new child after a phase that timed out or failed. */
async function runOurs(file: string, threads: number, timeoutS: number): Promise<OursRun> {
  const out: OursRun = { loadMs: [], rss: 0, dtype: null, residentBytes: null, phases: {} };
  let todo = [...ASKED];
  while (todo.length > 0) {
    const p = spawn(process.execPath, [import.meta.path, "--child", file, String(threads), todo.join(",")], { stdio: ["ignore", "pipe", "pipe"] });
    let buf = "";
    let err = "";
    let current: Phase = todo[0]!;
    let last: Tick | null = null;
    const started = performance.now();
    p.stderr.on("data", (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    p.stdout.on("data", (d: Buffer) => {
      buf += d.toString();
      let nl = buf.indexOf("\n");
      while (nl >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        nl = buf.indexOf("\n");
        let e: Record<string, unknown>;
        try {
          e = JSON.parse(line);
        } catch {
          continue;
        }
        if (e.event === "loaded") {
          out.loadMs.push(e.loadMs as number);
          out.dtype = e.dtype as string;
          out.residentBytes = e.residentBytes as number;
          out.rss = Math.max(out.rss, e.rss as number);
        } else if (e.event === "tick") last = e as unknown as Tick;
        else if (e.event === "done") {
          const ph = e.phase as Phase;
          out.phases[ph] = {
            tokPerS: e.tokPerS as number,
            ...(e.allTokPerS !== undefined ? { allTokPerS: e.allTokPerS as number, prefillTokPerS: e.prefillTokPerS as number } : {}),
          };
          out.rss = Math.max(out.rss, e.rss as number);
          todo = todo.filter((x) => x !== ph);
          current = todo[0] ?? current;
          last = null;
        }
      }
    });
    const timer = setTimeout(() => p.kill("SIGKILL"), timeoutS * 1000);
    const code: number | null = await new Promise((res) => p.on("exit", (c) => res(c)));
    clearTimeout(timer);
    if (todo.length === 0) break;
    const afterS = (performance.now() - started) / 1000;
    const tick = last as Tick | null;
    const reached =
      tick && tick.phase === current ? { tokens: tick.tokens, tokPerS: tick.ms > 0 ? (tick.tokens / tick.ms) * 1000 : null } : { tokens: 0, tokPerS: null };
    if (code === null && afterS >= timeoutS - 1) out.phases[current] = { tokPerS: null, timedOut: { afterS, ...reached } };
    else out.phases[current] = { tokPerS: null, error: `exit ${code}: ${errorLine(err)}` };
    // Nothing loaded at all: the next phase would fail the same way.
    if (out.loadMs.length === 0) {
      for (const ph of todo) out.phases[ph] ??= { ...out.phases[current]! };
      break;
    }
    todo = todo.filter((x) => x !== current);
  }
  return out;
}

interface TheirsRun {
  prefill: number | null;
  decode: number | null;
  batch: number | null;
  batchAll: number | null;
  batchPrefill: number | null;
  loadMs: number | null;
  rss: number;
  error?: string;
}

/** /usr/bin/time's maximum resident set size (kB) of a command, with its outputs. */
function timed(cmd: string[], timeoutS: number): { stdout: string; stderr: string; maxRss: number; status: number | null } {
  const r = spawnSync("/usr/bin/time", ["-f", "TL_MAXRSS_KB=%M", ...cmd], { encoding: "utf8", timeout: timeoutS * 1000, maxBuffer: 64 << 20 });
  const m = /TL_MAXRSS_KB=(\d+)/.exec(r.stderr ?? "");
  return { stdout: r.stdout ?? "", stderr: r.stderr ?? "", maxRss: m ? Number(m[1]) * 1024 : 0, status: r.status };
}

function runTheirs(b: LlamaCppBuild, file: string, threads: number, timeoutS: number): TheirsRun {
  const out: TheirsRun = { prefill: null, decode: null, batch: null, batchAll: null, batchPrefill: null, loadMs: null, rss: 0 };
  const [p, n] = [ASKED.includes("prefill") ? PREFILL : 0, ASKED.includes("decode") ? DECODE : 0];
  if (p > 0 || n > 0) {
    const bench = timed([b.bin["llama-bench"], "-m", file, "-t", String(threads), "-p", String(p), "-n", String(n), "-r", "1", "-o", "json"], timeoutS);
    try {
      const rows = JSON.parse(bench.stdout) as { n_prompt: number; n_gen: number; avg_ts: number }[];
      if (p > 0) out.prefill = rows.find((r) => r.n_prompt === PREFILL && r.n_gen === 0)?.avg_ts ?? null;
      if (n > 0) out.decode = rows.find((r) => r.n_gen === DECODE && r.n_prompt === 0)?.avg_ts ?? null;
    } catch {
      out.error = `llama-bench exit ${bench.status}: ${bench.stderr.trim().split("\n").slice(-3).join(" | ")}`;
    }
    out.rss = bench.maxRss;
  }
  if (!ASKED.includes("batch")) return out;
  const ctx = BATCH * (BATCH_PP + BATCH_TG);
  const bb = timed(
    [
      b.bin["llama-batched-bench"],
      "-m",
      file,
      "-t",
      String(threads),
      "-tb",
      String(threads),
      "-c",
      String(ctx),
      "-b",
      "2048",
      "-ub",
      "512",
      "-npp",
      String(BATCH_PP),
      "-ntg",
      String(BATCH_TG),
      "-npl",
      String(BATCH),
      "--output-format",
      "jsonl",
      "-v", // for its "load time" line
    ],
    timeoutS,
  );
  const line = bb.stdout
    .split("\n")
    .concat(bb.stderr.split("\n"))
    .find((l) => l.includes('"speed_tg"'));
  if (line) {
    const j = JSON.parse(line.slice(line.indexOf("{")));
    out.batch = j.speed_tg;
    out.batchAll = j.speed;
    out.batchPrefill = j.speed_pp;
  } else out.error = `${out.error ?? ""} llama-batched-bench exit ${bb.status}: ${bb.stderr.trim().split("\n").slice(-3).join(" | ")}`.trim();
  const load = /load time =\s+([\d.]+) ms/.exec(bb.stderr);
  out.loadMs = load ? Number(load[1]) : null;
  out.rss = Math.max(out.rss, bb.maxRss);
  return out;
}

/** Tensor types in the file, its size, and the bytes a decoded token reads (the embedding's rows aside, unless it is the classifier too). */
function fileFacts(file: string): { bytes: number; types: Record<string, number>; decodeReadBytes: number } {
  // The header only (Bun maps no file past 4 GiB whole; an 8B file's header is a few MB).
  const size = statSync(file).size;
  const head = new Uint8Array(Math.min(size, 64 << 20));
  const fd = openSync(file, "r");
  try {
    readSync(fd, head, 0, head.length, 0);
  } finally {
    closeSync(fd);
  }
  const g = parseGguf(head, file, size);
  const bytes = { length: size };
  const types: Record<string, number> = {};
  const sorted = [...g.tensors].sort((a, b) => a.offset - b.offset);
  const dataEnd = bytes.length - g.dataOffset;
  const tied = !g.tensors.some((t) => t.name === "output.weight");
  let read = 0;
  sorted.forEach((t, i) => {
    const size = (sorted[i + 1]?.offset ?? dataEnd) - t.offset;
    const name = ggmlTypeName(t.type);
    types[name] = (types[name] ?? 0) + 1;
    if (t.name !== "token_embd.weight" || tied) read += size;
  });
  return { bytes: bytes.length, types, decodeReadBytes: read };
}

function modelFile(b: LlamaCppBuild, size: string, type: string): string {
  const dir = join(cacheDir(), "models");
  mkdirSync(dir, { recursive: true });
  const shape = SHAPES[size];
  if (!shape) throw new Error(`SIZES: unknown size ${size}; known: ${Object.keys(SHAPES).join(", ")}`);
  const f16 = join(dir, `${size}-f16.gguf`);
  if (!existsSync(f16)) {
    const need = shapeHeader(shape).dataBytes;
    const free = statfsSync(dir).bavail * statfsSync(dir).bsize;
    if (free < need * 1.5)
      throw new Error(`${dir}: ${(free / 2 ** 30).toFixed(1)} GiB free, ${shape.name} at F16 needs ${(need / 2 ** 30).toFixed(1)} GiB and its quantized files`);
    console.error(`writing ${f16} (${shape.name}, random weights)`);
    let shown = 0;
    writeShapeGguf(f16, shape, 1, (done, total) => {
      if (done - shown > 1 << 30 || done === total) {
        shown = done;
        console.error(`  ${(done / 2 ** 30).toFixed(2)} / ${(total / 2 ** 30).toFixed(2)} GiB`);
      }
    });
  }
  if (type === "f16") return f16;
  const q = QUANT_NAMES[type];
  if (!q) throw new Error(`TYPES: unknown type ${type}; known: ${Object.keys(QUANT_NAMES).join(", ")}`);
  const out = join(dir, `${size}-${type}.gguf`);
  if (!existsSync(out)) {
    console.error(`quantizing ${f16} to ${q} with llama-quantize`);
    const r = spawnSync("nice", ["-n", "19", b.bin["llama-quantize"], f16, `${out}.partial`, q, "2"], { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`llama-quantize ${q}: ${r.stderr.slice(-2000)}`);
    spawnSync("mv", [`${out}.partial`, out]);
  }
  return out;
}

const GB = 1e9;
const fmt = (x: number | null | undefined, d = 1) => (x === null || x === undefined || !Number.isFinite(x) ? "—" : x.toFixed(d));
const ratio = (a: number | null, b: number | null) => (a && b ? a / b : null);

async function main(): Promise<void> {
  const sizes = (process.env.SIZES ?? "135m").split(",").map((s) => s.trim().toLowerCase());
  const types = (process.env.TYPES ?? "f16,q8_0,q4_k_m,q4_0").split(",").map((s) => s.trim().toLowerCase());
  const rounds = Number(process.env.ROUNDS ?? 3);
  const threads = Number(process.env.THREADS ?? availableParallelism());
  const timeoutS = Number(process.env.TIMEOUT_S ?? 300);
  const theirsTimeoutS = Number(process.env.LLAMA_TIMEOUT_S ?? 900);
  const b = ensureLlamaCpp();
  const cpu = cpus()[0]?.model ?? "?";
  const flags = (/^flags\s*:\s*(.*)$/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "").split(" ");
  const simd = flags.filter((f) => /^(sse4_2|avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|amx_tile)$/.test(f));
  console.log(
    `CPU ${cpu} (${availableParallelism()} cores; ${simd.join(" ")}); llama.cpp ${b.release} ${b.commit.slice(0, 12)} (${b.isa}) from node-llama-cpp 3.21.1; threads ${threads}; rounds ${rounds}`,
  );
  const rows: object[] = [];
  const loadBefore = loadAverage();
  const name = process.env.OUT ? `llamacpp.${process.env.OUT}.json` : "llamacpp.json";
  // Written after every row, so a run stopped part-way keeps what it measured.
  const save = () => {
    mkdirSync(join(import.meta.dir, "results"), { recursive: true });
    writeFileSync(
      join(import.meta.dir, "results", name),
      `${JSON.stringify(
        {
          bench: "llamacpp",
          cpu,
          cores: availableParallelism(),
          cpuFlags: simd,
          llamacpp: {
            release: b.release,
            commit: b.commit,
            isa: b.isa,
            from: "node-llama-cpp@3.21.1 llama/gitRelease.bundle",
            cmakeFlags: b.cmakeFlags,
            buildSeconds: b.buildSeconds,
          },
          settings: { threads, rounds, phases: ASKED, prefill: PREFILL, decode: DECODE, batch: BATCH, batchPrompt: BATCH_PP, batchGen: BATCH_TG, timeoutS },
          loadBefore,
          loadAfter: loadAverage(),
          rows,
        },
        null,
        2,
      )}\n`,
    );
  };
  for (const size of sizes) {
    for (const type of types) {
      const file = modelFile(b, size, type);
      const facts = fileFacts(file);
      const ours: OursRun[] = [];
      const theirs: TheirsRun[] = [];
      const loads: string[] = [];
      const summarize = () => {
        const med = (xs: (number | null | undefined)[]) => {
          const v = xs.filter((x): x is number => typeof x === "number" && Number.isFinite(x));
          return v.length ? median(v) : null;
        };
        const o = {
          decode: med(ours.map((x) => x.phases.decode?.tokPerS)),
          prefill: med(ours.map((x) => x.phases.prefill?.tokPerS)),
          batch: med(ours.map((x) => x.phases.batch?.tokPerS)),
          batchAll: med(ours.map((x) => x.phases.batch?.allTokPerS)),
          loadMs: med(ours.flatMap((x) => x.loadMs)),
          rss: Math.max(...ours.map((x) => x.rss)),
        };
        const t = {
          decode: med(theirs.map((x) => x.decode)),
          prefill: med(theirs.map((x) => x.prefill)),
          batch: med(theirs.map((x) => x.batch)),
          batchAll: med(theirs.map((x) => x.batchAll)),
          loadMs: med(theirs.map((x) => x.loadMs)),
          rss: Math.max(...theirs.map((x) => x.rss)),
        };
        const notes: string[] = [];
        for (const ph of ASKED) {
          const failed = ours.map((x) => x.phases[ph]).find((p) => p?.timedOut || p?.error);
          if (failed?.timedOut)
            notes.push(
              `ours ${ph}: timed out after ${failed.timedOut.afterS.toFixed(0)} s${failed.timedOut.tokPerS ? ` (${failed.timedOut.tokens} tokens at ${failed.timedOut.tokPerS.toFixed(2)} tok/s)` : ""}`,
            );
          else if (failed?.error) notes.push(`ours ${ph}: ${failed.error}`);
        }
        for (const x of theirs) if (x.error) notes.push(`llama.cpp: ${x.error}`);
        // Types our loader has no kernel for arrive widened to f32: say so beside the figures.
        const widened = Object.keys(facts.types).filter((k) => !["F32", "F16", "BF16", "Q8_0"].includes(k));
        if (widened.length && ours[0]?.dtype?.includes("f32")) notes.push(`ours: ${widened.join(", ")} widened to f32 at load (held as ${ours[0].dtype})`);
        const row = {
          size,
          shape: SHAPES[size]!.name,
          type,
          file: { bytes: facts.bytes, tensorTypes: facts.types, decodeReadBytes: facts.decodeReadBytes },
          threads,
          rounds: ours.length,
          loadAverage: loads,
          oursHeldAs: { dtype: ours[0]?.dtype ?? null, residentBytes: ours[0]?.residentBytes ?? null },
          ours: { ...o, decodeGBps: o.decode ? (o.decode * facts.decodeReadBytes) / GB : null },
          llamacpp: { ...t, decodeGBps: t.decode ? (t.decode * facts.decodeReadBytes) / GB : null },
          ratio: {
            decode: ratio(o.decode, t.decode),
            prefill: ratio(o.prefill, t.prefill),
            batch: ratio(o.batch, t.batch),
            batchAll: ratio(o.batchAll, t.batchAll),
            loadMs: ratio(o.loadMs, t.loadMs),
            rss: ratio(o.rss, t.rss),
          },
          notes,
          raw: { ours, llamacpp: theirs },
        };
        return { row, o, t, notes };
      };
      const rowAt = rows.length;
      for (let r = 0; r < rounds; r++) {
        loads.push(loadAverage());
        // Alternate who goes first, so neither always runs on the other's warm caches.
        if (r % 2 === 0) {
          theirs.push(runTheirs(b, file, threads, theirsTimeoutS));
          ours.push(await runOurs(file, threads, timeoutS));
        } else {
          ours.push(await runOurs(file, threads, timeoutS));
          theirs.push(runTheirs(b, file, threads, theirsTimeoutS));
        }
        // The row so far, saved after every round: a run stopped part-way keeps what it measured.
        rows[rowAt] = summarize().row;
        save();
        // A type that timed out once is not run again: every round would only time out again.
        if (Object.values(ours.at(-1)!.phases).some((p) => p.timedOut)) break;
      }
      const { row, o, t, notes } = summarize();
      rows[rowAt] = row;
      save();
      const MiB = 2 ** 20;
      console.log(
        `${size} ${type} (${(facts.bytes / 2 ** 30).toFixed(2)} GiB; ${Object.entries(facts.types)
          .map(([k, v]) => `${k}×${v}`)
          .join(" ")}; ours held as ${ours[0]?.dtype ?? "?"}) load ${loads.join(" / ")}\n` +
          `  decode ${fmt(o.decode)} vs ${fmt(t.decode)} tok/s = ${fmt(row.ratio.decode, 2)}x (${fmt(row.ours.decodeGBps, 2)} vs ${fmt(row.llamacpp.decodeGBps, 2)} GB/s)` +
          ` | prefill ${PREFILL} ${fmt(o.prefill)} vs ${fmt(t.prefill)} = ${fmt(row.ratio.prefill, 2)}x` +
          ` | batch ${BATCH} decode ${fmt(o.batch)} vs ${fmt(t.batch)} = ${fmt(row.ratio.batch, 2)}x (all ${fmt(o.batchAll)} vs ${fmt(t.batchAll)})\n` +
          `  load ${fmt(o.loadMs, 0)} vs ${fmt(t.loadMs, 0)} ms | peak RSS ${fmt(o.rss / MiB, 0)} vs ${fmt(t.rss / MiB, 0)} MiB` +
          (notes.length ? `\n  ${notes.join("\n  ")}` : ""),
      );
    }
  }
  save();
  console.log(`wrote bench/results/${name}`);
}

if (process.argv[2] === "--child") {
  const [file, threads, phases] = process.argv.slice(3);
  if (!file || !statSync(file).isFile()) throw new Error(`--child: no file ${file}`);
  await child(file, Number(threads), phases!.split(",") as Phase[]);
} else await main();
