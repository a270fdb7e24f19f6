// bench/c/run_ref.c, the C loop bench/model.ts measures us by: built with the host's compiler,
// run on a llama2.c checkpoint, its tokens and tok/s parsed from what it prints.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { median } from "./stats.ts";

export interface Reference {
  name: string;
  exe: string;
  command: string;
  env: Record<string, string>;
}

export interface Build {
  name: string;
  flags: string[];
  env: Record<string, string>;
}

/** llama2.c's `make runomp`: -Ofast -fopenmp -march=native, OMP_NUM_THREADS = cores. */
function runomp(cores: number): Build {
  return { name: "runomp (-Ofast -fopenmp -march=native)", flags: ["-Ofast", "-fopenmp", "-march=native"], env: { OMP_NUM_THREADS: String(cores) } };
}

/** llama2.c's `make run` and `make runomp`. */
export function runcBuilds(cores: number): Build[] {
  return [{ name: "run (-O3)", flags: ["-O3"], env: {} }, runomp(cores)];
}

/**
 * runomp, and runomp held to x86-64-v2 (SSE4.2: 128-bit vectors, no FMA, the instructions
 * WebAssembly's 128-bit SIMD maps to), for the batch-8 comparison.
 */
export function batchBuilds(cores: number): Build[] {
  const omp = runomp(cores);
  return [omp, { ...omp, name: "runomp 128-bit, no FMA (-Ofast -fopenmp -march=x86-64-v2)", flags: ["-Ofast", "-fopenmp", "-march=x86-64-v2"] }];
}

/** run_ref.c built each way into dir; a build no compiler takes is left out (and said). */
export function buildReferences(dir: string, builds: Build[]): Reference[] {
  const src = join(import.meta.dir, "c", "run_ref.c");
  const out: Reference[] = [];
  for (const b of builds) {
    for (const cc of ["gcc", "cc"]) {
      const exe = join(dir, `run_ref_${b.flags.join("").replace(/[^a-z0-9]/gi, "")}`);
      // The same flags in the same run's dir (runomp in both lists) were built already.
      const r = existsSync(exe) ? { status: 0, error: undefined, stderr: "" } : spawnSync(cc, [...b.flags, "-o", exe, src, "-lm"], { encoding: "utf8" });
      if (r.status === 0) {
        out.push({ name: b.name, exe, command: `${cc} ${b.flags.join(" ")} -o run run_ref.c -lm`, env: b.env });
        break;
      }
      if (r.error === undefined) console.log(`${cc} ${b.flags.join(" ")} failed on run_ref.c: ${r.stderr.trim()}`);
    }
  }
  return out;
}

/** `steps` greedy positions of `batch` sequences from BOS (run_ref's BATCH): sequence 0's tokens, tok/s of all. */
export function runReference(ref: Reference, path: string, steps: number, batch = 1): { tokens: number[]; tokensPerSec: number } {
  const r = spawnSync(ref.exe, [path, String(steps), "1", String(batch)], { encoding: "utf8", env: { ...process.env, ...ref.env } });
  if (r.status !== 0) throw new Error(`run_ref exited ${r.status}: ${r.stderr}`);
  const toks = /^tokens:(.*)$/m.exec(r.stdout);
  const rate = /^tok\/s: ([0-9.]+)$/m.exec(r.stdout);
  if (toks === null || rate === null) throw new Error(`run_ref printed no tokens or rate: ${r.stdout.slice(0, 200)}`);
  return { tokens: toks[1]!.trim().split(/\s+/).map(Number), tokensPerSec: Number(rate[1]) };
}

export interface CBatch {
  command: string;
  batch1TokS: number;
  batch8TokS: number;
  /** The median of the rounds' batch-8 over batch-1 tok/s. */
  batch8OverBatch1: number;
  rounds: number[];
}

/** One round of each build at batch 1 then batch 8 over positions 0 .. 191 (a mean context of 96). */
export function cBatchRound(refs: Reference[], path: string): { batch1: number; batch8: number }[] {
  return refs.map((ref) => ({ batch1: runReference(ref, path, 192, 1).tokensPerSec, batch8: runReference(ref, path, 192, 8).tokensPerSec }));
}

/** Each build's medians over rounds of cBatchRound: what batching buys C's loop on this machine. */
export function cBatchSummary(refs: Reference[], rounds: { batch1: number; batch8: number }[][]): Record<string, CBatch> {
  const out: Record<string, CBatch> = {};
  refs.forEach((ref, i) => {
    const runs = rounds.map((r) => r[i]!);
    const ratios = runs.map((r) => r.batch8 / r.batch1);
    out[ref.name] = {
      command: ref.command,
      batch1TokS: median(runs.map((r) => r.batch1)),
      batch8TokS: median(runs.map((r) => r.batch8)),
      batch8OverBatch1: median(ratios),
      rounds: ratios,
    };
  });
  return out;
}
