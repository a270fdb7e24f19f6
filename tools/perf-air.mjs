// Where a WebAssembly kernel spends its time, instruction by instruction: perf's samples mapped
// onto the Air that Bun's JavaScriptCore prints for each function its optimizing tier compiles.
// Bun 1.4.4 has no disassembler built in, but its Air dump gives the address range of every Air
// instruction, and perf's cpu-clock samples give addresses (no hardware counters on this VM).
// Found this way: q6_k's subnormal scales (an assist per multiply) and a dtype tested per vector
// in the f16 decode loop (see f16.ts and matmul.ts' strip8x1F16). Skid puts a stall's samples on
// the instruction after the one waiting.
//
//   BUN_JSC_dumpOMGDisassembly=1 perf record -e cpu-clock -F 5000 -o perf.data \
//     node_modules/bun/bin/bun.exe SCRIPT.ts > air.txt 2>&1
//   perf script -i perf.data -F ip | sort | uniq -c > ips.txt
//   node tools/perf-air.mjs air.txt ips.txt                  # the hottest blocks
//   node tools/perf-air.mjs air.txt ips.txt BB#19 10         # one block of function 10, per instruction
//
// A function's number is JavaScriptCore's (imports first), its size in the dump's header line.
import { readFileSync } from "node:fs";

const [dumpFile, ipsFile, block, fn] = process.argv.slice(2);
if (!dumpFile || !ipsFile) {
  console.error("usage: node tools/perf-air.mjs AIR_DUMP IPS [BB#n FUNCTION]");
  process.exit(2);
}
const ranges = []; // [start, end, function, block, air instruction]
let fnName = "";
let bb = "";
let air = "";
for (const line of readFileSync(dumpFile, "utf8").split("\n")) {
  const f = line.match(/^Generated OMG functionIndexSpace:\((\d+)\).*wasmSize:\((\d+)\)/);
  if (f) fnName = `fn ${f[1]} (${f[2]} bytes)`;
  if (line.startsWith("Air BB#")) bb = line.slice(4).split(":")[0];
  else if (line.startsWith("Air ")) air = line.slice(4).trim();
  const r = line.match(/range (0x[0-9a-f]+)\.\.\.(0x[0-9a-f]+)/);
  if (r) ranges.push([BigInt(r[1]), BigInt(r[2]), fnName, bb, air]);
}
ranges.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));

const hits = new Map();
let total = 0;
let mapped = 0;
for (const line of readFileSync(ipsFile, "utf8").trim().split("\n")) {
  const [count, ip] = line.trim().split(/\s+/);
  const c = Number(count);
  const at = BigInt(`0x${ip}`);
  total += c;
  let lo = 0;
  let hi = ranges.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid][0] <= at) {
      found = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  if (found >= 0 && at < ranges[found][1]) {
    mapped += c;
    hits.set(found, (hits.get(found) ?? 0) + c);
  }
}
console.log(`${total} samples, ${mapped} in optimized WebAssembly`);
if (!block) {
  const blocks = new Map();
  for (const [k, c] of hits) {
    const key = `${ranges[k][2]} ${ranges[k][3]}`;
    blocks.set(key, (blocks.get(key) ?? 0) + c);
  }
  for (const [key, c] of [...blocks].sort((a, b) => b[1] - a[1]).slice(0, 20)) console.log(`${((100 * c) / total).toFixed(1).padStart(5)}%  ${key}`);
} else {
  for (let k = 0; k < ranges.length; k++) {
    const r = ranges[k];
    if (r[3] === block && (!fn || r[2].startsWith(`fn ${fn} `))) console.log(String(hits.get(k) ?? 0).padStart(7), r[4]);
  }
}
