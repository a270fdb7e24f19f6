// One GGUF model's decode (or a batch of 8 sequences, or a prefill) on this tree's kernels against another
// revision's, in alternating rounds: how the kernel commits of issue 25 were measured (their
// messages give "A -> B ms a token"). The other revision is checked out into a temporary
// worktree (node_modules linked); each round loads the model afresh in a child process of either
// tree, warms up, then times STEPS steps. Prints each side's median ms a token (a step for
// BATCH=8, a whole prompt for PREFILL), the ratio base / this, and the load average; JSON to
// bench/results/decode-ab.json (OUT=name for decode-ab.<name>.json).
//
//   MODEL=~/.cache/tl-engine/llamacpp/models/1b-q4_k_m.gguf BASE=HEAD~1 bun bench/decode-ab.ts
//   (ROUNDS=2 STEPS=24 THREADS=2 BATCH=1; BATCH=8 runs 8 sequences of PROMPT=32 tokens each;
//   PREFILL=512 times STEPS prompts of 512 tokens instead, each into fresh blocks, as llama-bench -p;
//   GROUP_BYTES=3e8 cuts the model into layer groups of that many placed bytes, as past 4 GiB)
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { loadAverage, median } from "./stats.ts";

const MODEL = process.env.MODEL;
if (!MODEL || !existsSync(MODEL)) throw new Error("MODEL: the path of a GGUF file to run");
const BASE = process.env.BASE ?? "HEAD~1";
const ROUNDS = Number(process.env.ROUNDS ?? 2);
const STEPS = Number(process.env.STEPS ?? 24);
const THREADS = Number(process.env.THREADS ?? 2);
const BATCH = Number(process.env.BATCH ?? 1);
const PROMPT = Number(process.env.PROMPT ?? 32);
const PREFILL = Number(process.env.PREFILL ?? 0);
const GROUP_BYTES = process.env.GROUP_BYTES ? Number(process.env.GROUP_BYTES) : undefined;
if (GROUP_BYTES !== undefined && !(GROUP_BYTES > 0)) throw new Error("GROUP_BYTES: bytes a layer group may place");
if (!Number.isInteger(PREFILL) || PREFILL < 0) throw new Error("PREFILL: a prompt length, or 0 for decode");
if (PREFILL > 0 && BATCH !== 1) throw new Error("PREFILL times one prompt at a time: leave BATCH unset (it would be ignored)");
const unit = PREFILL > 0 ? `prefill of ${PREFILL}` : BATCH > 1 ? "step" : "token";
const here = resolve(import.meta.dir, "..");

/** The child: loads MODEL with `tree`'s sources and prints {"ms": per step} on its last line. */
function childSource(tree: string): string {
  return `
import { readModelFilesFor } from ${JSON.stringify(join(tree, "src/model/load/load-model.ts"))};
import { Transformer } from ${JSON.stringify(join(tree, "src/model/compute/transformer.ts"))};
import { kvShapeOf } from ${JSON.stringify(join(tree, "src/model/index.ts"))};
const f = readModelFilesFor({ modelPath: ${JSON.stringify(MODEL)}, maxSeqLen: 1024, dtype: "as-stored" });
const m = new Transformer(f.cfg, f.weights, { threads: ${THREADS}${GROUP_BYTES ? `, groupBytes: ${GROUP_BYTES}` : ""} });
await m.ready();
const seqs = ${BATCH};
const prefill = ${PREFILL};
if (prefill > 0) {
  const pool = m.kvPool(kvShapeOf(f.cfg, 16), Math.ceil(prefill / 16) + 8);
  const out = new Float32Array(f.cfg.vocabSize);
  const once = (k) => {
    const table = pool.allocate(Math.ceil(prefill / 16));
    m.forward(pool, [{ blockTable: table, startPos: 0, tokens: Array.from({ length: prefill }, (_, i) => ((i * 7919 + k) % 1000) + 5) }], out);
    pool.releaseAll(table);
  };
  once(0);
  const t0 = performance.now();
  for (let k = 1; k <= ${STEPS}; k++) once(k);
  console.log(JSON.stringify({ ms: (performance.now() - t0) / ${STEPS} }));
  m.close();
  process.exit(0);
}
const pool = m.kvPool(kvShapeOf(f.cfg, 16), seqs * 12 + 8);
const tables = Array.from({ length: seqs }, () => pool.allocate(10));
const out = new Float32Array(f.cfg.vocabSize * seqs);
const start = seqs > 1 ? ${PROMPT} : 0;
if (seqs > 1) for (let s = 0; s < seqs; s++) m.forward(pool, [{ blockTable: tables[s], startPos: 0, tokens: Array.from({ length: start }, (_, i) => ((i * 31 + s * 7) % 1000) + 5) }], out);
const step = (k) => m.forward(pool, tables.map((t, s) => ({ blockTable: t, startPos: start + k, tokens: [((k * 13 + s) % 1000) + 5] })), out);
for (let k = 0; k < 4; k++) step(k);
const t0 = performance.now();
for (let k = 4; k < 4 + ${STEPS}; k++) step(k);
console.log(JSON.stringify({ ms: (performance.now() - t0) / ${STEPS} }));
m.close();
process.exit(0);
`;
}

const tmp = mkdtempSync(join(tmpdir(), "decode-ab-"));
const baseTree = join(tmp, "base");
const git = (...args: string[]) => {
  const r = spawnSync("git", args, { cwd: here, encoding: "utf8" });
  if (r.status !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr}`);
  return r.stdout.trim();
};
const baseRev = git("rev-parse", BASE);
const headRev = git("rev-parse", "HEAD");
git("worktree", "add", "--detach", baseTree, baseRev);
symlinkSync(join(here, "node_modules"), join(baseTree, "node_modules"));
const sides = [
  { name: "base", tree: baseTree, rev: baseRev, ms: [] as number[] },
  { name: "this", tree: here, rev: `${headRev}${git("status", "--porcelain", "--untracked-files=no") ? " (modified)" : ""}`, ms: [] as number[] },
];
const loadBefore = loadAverage();
try {
  for (const s of sides) writeFileSync(join(tmp, `${s.name}.ts`), childSource(s.tree));
  for (let r = 0; r < ROUNDS; r++) {
    for (const s of r % 2 === 0 ? sides : [...sides].reverse()) {
      const c = spawnSync(process.execPath, [join(tmp, `${s.name}.ts`)], { encoding: "utf8", timeout: 900_000 });
      const last = c.stdout.trim().split("\n").pop() ?? "";
      if (c.status !== 0 || !last.startsWith("{")) throw new Error(`${s.name} round ${r}: ${c.stderr.slice(-2000)}`);
      s.ms.push((JSON.parse(last) as { ms: number }).ms);
      console.log(`round ${r + 1} ${s.name}: ${s.ms.at(-1)!.toFixed(1)} ms a ${unit}`);
    }
  }
} finally {
  spawnSync("git", ["worktree", "remove", "--force", baseTree], { cwd: here });
  rmSync(tmp, { recursive: true, force: true });
}
const [base, mine] = [median(sides[0]!.ms), median(sides[1]!.ms)];
const loadAfter = loadAverage();
console.log(
  `${MODEL}: base ${base.toFixed(1)} ms, this ${mine.toFixed(1)} ms: this is ${(base / mine).toFixed(3)}x as fast (${PREFILL > 0 ? `prefill ${PREFILL}` : `batch ${BATCH}`}, ${THREADS} threads, load ${loadBefore} -> ${loadAfter})`,
);
const dir = join(here, "bench", "results");
mkdirSync(dir, { recursive: true });
const out = {
  bench: "decode-ab",
  cpu: cpus()[0]?.model,
  model: MODEL,
  settings: { rounds: ROUNDS, steps: STEPS, threads: THREADS, batch: BATCH, prompt: BATCH > 1 ? PROMPT : 0, prefill: PREFILL, groupBytes: GROUP_BYTES ?? null },
  loadBefore,
  loadAfter,
  sides: sides.map(({ name, rev, ms }) => ({ name, rev, ms, median: median(ms) })),
  speedup: base / mine,
};
writeFileSync(join(dir, process.env.OUT ? `decode-ab.${process.env.OUT}.json` : "decode-ab.json"), `${JSON.stringify(out, null, 2)}\n`);
