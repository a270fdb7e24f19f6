// Load-time work on one model file, in this process, phase by phase, wall and CPU time (user and
// system: on a machine shared with other work the wall clock counts their turns too):
//   read     : the file parsed and mapped (readModelFiles, weights as stored)
//   convert  : `--dtype q8_0` of the 16-bit matrices (castWeights; the converting line), GB/s of input
//   place    : the held weights copied into kernel memory in the strip layout (new Transformer)
// Env: FILE (default the bench's 1B-shape F16 GGUF), DTYPE (q8_0, or as-stored to skip the
// conversion), THREADS (2). JSON to bench/results/load-convert.<OUT>.json when OUT is set.
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus, homedir } from "node:os";
import { join } from "node:path";
import { castWeights, weightsBytes } from "../src/model/compute/weights.ts";
import { Transformer } from "../src/model/compute/transformer.ts";
import { readModelFiles } from "../src/model/load/load-model.ts";
import type { DType } from "../src/model/index.ts";
import { loadAverage } from "./stats.ts";

const file = process.env.FILE ?? join(homedir(), ".cache/tl-engine/llamacpp/models/1b-f16.gguf");
const dtype = (process.env.DTYPE ?? "q8_0") as DType | "as-stored";
const threads = Number(process.env.THREADS ?? 2);

interface Phase {
  wallMs: number;
  userMs: number;
  sysMs: number;
}
const phases: Record<string, Phase> = {};
let t = performance.now();
let c = process.cpuUsage();
function lap(name: string): void {
  const now = performance.now();
  const d = process.cpuUsage(c);
  phases[name] = { wallMs: now - t, userMs: d.user / 1000, sysMs: d.system / 1000 };
  console.log(`${name.padEnd(8)} wall ${(now - t).toFixed(0)} ms, user ${(d.user / 1000).toFixed(0)} ms, system ${(d.system / 1000).toFixed(0)} ms`);
  t = now;
  c = process.cpuUsage();
}

const loadBefore = loadAverage();
const f = readModelFiles(file, { dtype: "as-stored", maxSeqLen: 1024 });
const inputBytes = weightsBytes(f.weights);
lap("read");
const w = castWeights(f.cfg, f.weights, dtype);
lap("convert");
const m = new Transformer(f.cfg, w, { threads });
await m.ready();
lap("place");
const conv = phases.convert!;
const out = {
  bench: "load-convert",
  cpu: cpus()[0]?.model,
  file,
  dtype,
  threads,
  inputBytes,
  heldBytes: weightsBytes(w),
  convertGBsWall: dtype === "as-stored" ? null : inputBytes / conv.wallMs / 1e6,
  convertGBsCpu: dtype === "as-stored" ? null : inputBytes / (conv.userMs + conv.sysMs) / 1e6,
  phases,
  loadBefore,
  loadAfter: loadAverage(),
};
console.log(
  `convert ${out.convertGBsWall?.toFixed(2)} GB/s of input wall, ${out.convertGBsCpu?.toFixed(2)} per CPU-s; load average ${loadBefore} -> ${out.loadAfter}`,
);
if (process.env.OUT) {
  const dir = join(import.meta.dir, "results");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, `load-convert.${process.env.OUT}.json`), `${JSON.stringify(out, null, 2)}\n`);
}
m.close();
process.exit(0);
