// `npm run bench`: every benchmark in this folder, one after another (they share the
// machine, so never at once). Each prints its ratios and writes bench/results/<name>.json.
// Names on the command line pick a subset: `npm run bench -- codec transfer`.
import { readdirSync } from "node:fs";
import { join } from "node:path";

const dir = import.meta.dir;
// llamacpp.ts builds llama.cpp (about 16 minutes the first time) and writes GB-sized model files: run it by name.
const helpers = new Set(["run-all.ts", "transfer-sink.ts", "raw-sink.ts", "llamacpp-build.ts", "gguf-shapes.ts", "llamacpp.ts"]);
const all = readdirSync(dir)
  .filter((f) => f.endsWith(".ts") && !helpers.has(f))
  .sort();
const wanted = process.argv.slice(2);
const chosen = wanted.length === 0 ? all : all.filter((f) => wanted.includes(f.replace(/\.ts$/, "")));
if (chosen.length === 0) {
  console.error(`no benchmark named ${wanted.join(", ")}; have ${all.map((f) => f.replace(/\.ts$/, "")).join(", ")}`);
  process.exit(2);
}
let failed = 0;
for (const f of chosen) {
  console.log(`\n=== ${f} ===`);
  const p = Bun.spawn([process.execPath, join(dir, f)], { stdout: "inherit", stderr: "inherit", env: process.env });
  const code = await p.exited;
  if (code !== 0) {
    failed++;
    console.error(`${f} exited with ${code}`);
  }
}
process.exit(failed === 0 ? 0 : 1);
