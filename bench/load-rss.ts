// RSS while loading an f16 Hugging Face folder of a ~43M-parameter model: today's path (every
// matrix to f32, then packed back to f16) against the matrices packed straight from the file.
// Each load runs in a fresh child process so one's garbage never counts against the other.
// Prints peak RSS growth (VmHWM minus the RSS before loading) and its anonymous / file-backed
// parts after the load; the mapped file's pages are clean and shared with the page cache. Then,
// after a GC, what stays: with the Transformer built, each weight should be held once (in the
// kernels' memory), so about 1x the weight bytes.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { servedModelOf } from "../src/cli/engine-node.ts";
import { castWeights, syntheticWeights } from "../src/model/compute/weights.ts";
import { type ModelConfig, weightsBytes } from "../src/model/index.ts";
import { readModelFiles } from "../src/model/load/load-model.ts";
import { ByteTokenizer } from "../src/tokenizer/tokenizer.ts";
import { writeHfFolder } from "../test/support/model-writers.ts";

const CFG: ModelConfig = {
  name: "rss-43m",
  dim: 512,
  hiddenDim: 1024,
  nLayers: 4,
  nHeads: 8,
  nKvHeads: 8,
  vocabSize: 32000,
  maxSeqLen: 256,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const MODES = ["f32-then-pack", "packed-direct", "f32-then-pack+transformer", "packed-direct+transformer"] as const;
type Mode = (typeof MODES)[number];
const MB = 1024 * 1024;

function status(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of readFileSync("/proc/self/status", "utf8").split("\n")) {
    const m = /^(VmRSS|VmHWM|RssAnon|RssFile):\s+(\d+) kB/.exec(line);
    if (m) out[m[1]!] = Number(m[2]) * 1024;
  }
  return out;
}

/** Loads the folder as `mode` says; only what the engine would keep is returned (the loader's locals die here). */
function load(mode: Mode, dir: string): { weightBytes: number; keep: unknown; close(): void } {
  const direct = mode.startsWith("packed-direct");
  const files = readModelFiles(dir, direct ? { dtype: "as-stored" } : {});
  const weights = castWeights(files.cfg, files.weights, "f16");
  const weightBytes = weightsBytes(weights);
  if (!mode.endsWith("+transformer")) return { weightBytes, keep: weights, close() {} };
  const served = servedModelOf({ ...files, weights, tokenizer: new ByteTokenizer(), chatTemplate: null }, { dtype: "f16", threads: 1 });
  return { weightBytes, keep: served, close: () => served.close?.() };
}

async function child(mode: Mode, dir: string): Promise<void> {
  Bun.gc(true);
  const before = status();
  const held = load(mode, dir);
  const after = status();
  // What stays once the garbage is gone: a mapped file nobody views is unmapped when collected.
  for (let i = 0; i < 3; i++) {
    await Bun.sleep(10);
    Bun.gc(true);
  }
  const settled = status();
  const report = {
    mode,
    weightBytes: held.weightBytes,
    peakGrowth: after.VmHWM! - before.VmRSS!,
    anonGrowth: after.RssAnon! - before.RssAnon!,
    fileGrowth: after.RssFile! - before.RssFile!,
    settledGrowth: settled.VmRSS! - before.VmRSS!,
    settledAnonGrowth: settled.RssAnon! - before.RssAnon!,
    settledFileGrowth: settled.RssFile! - before.RssFile!,
  };
  held.close();
  console.log(JSON.stringify(report));
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "tl-bench-rss-"));
  const loadBefore = loadavg()
    .map((l) => l.toFixed(2))
    .join(" ");
  try {
    writeHfFolder(join(dir, "m"), CFG, syntheticWeights(CFG, 43), { dtype: "F16" });
    const rows: Record<string, number>[] = [];
    for (const mode of MODES) {
      const p = Bun.spawn([process.execPath, import.meta.path, "--child", mode, join(dir, "m")], { stdout: "pipe", stderr: "inherit" });
      const out = await new Response(p.stdout).text();
      if ((await p.exited) !== 0) throw new Error(`child ${mode} failed`);
      rows.push(JSON.parse(out.trim().split("\n").at(-1)!));
    }
    const fmt = (n: number) => `${(n / MB).toFixed(1)} MiB`;
    for (const r of rows) {
      console.log(
        `${r.mode}: peak RSS growth ${fmt(r.peakGrowth!)} (anon ${fmt(r.anonGrowth!)}, file-backed ${fmt(r.fileGrowth!)}); ` +
          `after GC ${fmt(r.settledGrowth!)} = ${(r.settledGrowth! / r.weightBytes!).toFixed(2)}x the weights ${fmt(r.weightBytes!)}`,
      );
    }
    const ratio = rows[1]!.peakGrowth! / rows[0]!.peakGrowth!;
    const ratioT = rows[3]!.peakGrowth! / rows[2]!.peakGrowth!;
    // The engine's steady state: RSS the built Transformer keeps, per byte of weights (1.0 = held once).
    const heldPerWeightByte = rows[3]!.settledGrowth! / rows[3]!.weightBytes!;
    console.log(
      `packed-direct / f32-then-pack peak growth: ${ratio.toFixed(2)}x loading, ${ratioT.toFixed(2)}x with the Transformer built; ` +
        `the built Transformer keeps ${heldPerWeightByte.toFixed(2)}x its weight bytes after GC; load ${loadBefore}`,
    );
    mkdirSync(join(import.meta.dir, "results"), { recursive: true });
    writeFileSync(
      join(import.meta.dir, "results", "load-rss.json"),
      JSON.stringify(
        { bench: "load-rss", config: CFG, loadBefore, loadAfter: loadavg(), rows, ratio, ratioWithTransformer: ratioT, heldPerWeightByte },
        null,
        2,
      ) + "\n",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[2] === "--child") await child(process.argv[3] as Mode, process.argv[4]!);
else await main();
