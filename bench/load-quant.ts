// Load time and peak RSS of a K-quant (or legacy-quant) GGUF file as the engine loads it (the
// file mapped and parsed, then the Transformer built on THREADS threads, its weights placed in
// the kernels' strip layout), the K-quant and legacy matrices placed two ways in alternating
// rounds, each load in a fresh child process (so its peak RSS is its own):
//   js      : the plain-JS packers on the calling thread (k-quant-strips.ts, legacy-strips.ts)
//   kernels : kernels/assembly/place-strips.ts on every thread, the rows staged from the file
//   one     : as kernels, on one thread (THREADS 1): what the helpers add, or cost on a busy machine
//   before  : with BEFORE set, the `kernels` child of the checkout at BEFORE (an earlier commit's
//             tree with node_modules): the same load as that commit placed it
// Prints each mode's median wall, CPU (user + system) and peak RSS, the ratio js / kernels, the
// RSS budget issue 25 sets (file size x 1.1 + KV pool + 300 MB), the load average and the CPU.
// Env: FILE (default the bench's 1B-shape Q4_K_M GGUF), THREADS (2), ROUNDS (3), MAXSEQ (1024),
// MODES (default "js,kernels", or "before,kernels" when BEFORE is set).
// JSON to bench/results/load-quant.<OUT>.json (OUT default "latest").
import { mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { cpus, homedir } from "node:os";
import { join } from "node:path";
import { Transformer } from "../src/model/compute/transformer.ts";
import { holdWeights } from "../src/model/compute/weights.ts";
import { readModelFiles } from "../src/model/load/load-model.ts";
import { loadAverage, median } from "./stats.ts";

const file = process.env.FILE ?? join(homedir(), ".cache/tl-engine/llamacpp/models/1b-q4_k_m.gguf");
const threads = Number(process.env.THREADS ?? 2);
const rounds = Number(process.env.ROUNDS ?? 3);
const maxSeqLen = Number(process.env.MAXSEQ ?? 1024);
type Mode = "js" | "kernels" | "one" | "before";
const before = process.env.BEFORE;
const MODES = (process.env.MODES ?? (before ? "before,kernels" : "js,kernels")).split(",") as Mode[];
const MB = 1e6;

interface Row {
  mode: Mode;
  wallMs: number;
  cpuMs: number;
  peakRss: number;
  kvBytes: number;
}

function vm(key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(readFileSync("/proc/self/status", "utf8"));
  return Number(m![1]) * 1024;
}

async function child(mode: Mode): Promise<void> {
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  const f = readModelFiles(file, { dtype: "as-stored", maxSeqLen });
  const w = holdWeights(f.cfg, f.weights, f.stats.dtype);
  const stage = process.env.STAGE ? Number(process.env.STAGE) : undefined;
  const t = new Transformer(f.cfg, w, { threads: mode === "one" ? 1 : threads, placeJs: mode === "js", placeStageBytes: stage });
  await t.ready();
  const c = process.cpuUsage(c0);
  const row: Row = {
    mode,
    wallMs: performance.now() - t0,
    cpuMs: (c.user + c.system) / 1000,
    peakRss: vm("VmHWM"),
    // No KV pool is built here: the budget's KV term is 0.
    kvBytes: 0,
  };
  console.log(JSON.stringify(row));
  process.exit(0);
}

async function main(): Promise<void> {
  const fileBytes = statSync(file).size;
  const loadBefore = loadAverage();
  const rows: Row[] = [];
  for (let r = 0; r < rounds; r++) {
    for (const mode of r % 2 === 0 ? MODES : [...MODES].reverse()) {
      const script = mode === "before" ? join(before!, "bench", "load-quant.ts") : import.meta.path;
      const p = Bun.spawn([process.execPath, script, "--child", mode === "before" ? "kernels" : mode], { stdout: "pipe", stderr: "inherit", env: process.env });
      const out = await new Response(p.stdout).text();
      if ((await p.exited) !== 0) throw new Error(`child ${mode} failed`);
      const row = { ...(JSON.parse(out.trim().split("\n").at(-1)!) as Row), mode };
      rows.push(row);
      console.log(
        `${mode.padEnd(8)} wall ${row.wallMs.toFixed(0)} ms, CPU ${row.cpuMs.toFixed(0)} ms, peak RSS ${(row.peakRss / MB).toFixed(0)} MB; load ${loadAverage()}`,
      );
    }
  }
  const of = (mode: Mode, k: "wallMs" | "cpuMs" | "peakRss") => median(rows.filter((r) => r.mode === mode).map((r) => r[k]));
  const kvBytes = rows[0]!.kvBytes;
  const budget = fileBytes * 1.1 + kvBytes + 300 * MB;
  const [base, next] = [MODES[0]!, MODES.at(-1)!];
  const summary = {
    baseline: base,
    baseWallMs: of(base, "wallMs"),
    wallMs: of(next, "wallMs"),
    baseCpuMs: of(base, "cpuMs"),
    cpuMs: of(next, "cpuMs"),
    basePeakRss: of(base, "peakRss"),
    peakRss: of(next, "peakRss"),
  };
  const ratioWall = summary.baseWallMs / summary.wallMs;
  const ratioCpu = summary.baseCpuMs / summary.cpuMs;
  const loadAfter = loadAverage();
  console.log(
    `load of ${file}: ${base} ${summary.baseWallMs.toFixed(0)} ms, ${next} ${summary.wallMs.toFixed(0)} ms wall (${ratioWall.toFixed(2)}x); ` +
      `CPU ${summary.baseCpuMs.toFixed(0)} / ${summary.cpuMs.toFixed(0)} ms (${ratioCpu.toFixed(2)}x); peak RSS ${base} ${(summary.basePeakRss / MB).toFixed(0)} MB, ` +
      `${next} ${(summary.peakRss / MB).toFixed(0)} MB, budget ${(budget / MB).toFixed(0)} MB (file ${(fileBytes / MB).toFixed(0)} x 1.1 + KV ${(kvBytes / MB).toFixed(0)} + 300); load ${loadBefore} -> ${loadAfter}`,
  );
  const dir = join(import.meta.dir, "results");
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, `load-quant.${process.env.OUT ?? "latest"}.json`),
    `${JSON.stringify({ bench: "load-quant", cpu: cpus()[0]?.model, file, fileBytes, threads, rounds, maxSeqLen, rows, ...summary, ratioWall, ratioCpu, budget, loadBefore, loadAfter }, null, 2)}\n`,
  );
}

if (process.argv[2] === "--child") await child(process.argv[3] as Mode);
else await main();
