// What bounds a matmul kernel here (issue 25: decode below llama.cpp's rate although both read
// the same bytes). One thread runs each kernel straight (no dispatch, no model) on matrices of
// 2048-weight rows sized to sit in L2 (1 MB), in L3 (256 MB: this machine's L3 is 480 MB, so the
// 135M shape's weights stay there between tokens) and in DRAM (1 GiB, as a 1B shape's), for 1
// token row (decode), 8 (a batch) and 512 (prefill), and prints GB/s of weights and GMAC/s per
// CPU-second (process CPU time: on a machine shared with other work, wall time counts their turns
// too) beside wall time. The quantized kernels run on x quantized once beforehand (as a dispatch
// does). Then the serial model: the rate the kernel would have if it first waited for its bytes at
// the f32 kernel's DRAM rate and then computed at its in-L2 rate, against the DRAM rate measured:
// where they agree, the core overlaps little of its memory wait with its arithmetic (WebAssembly
// has no prefetch instruction), and a kernel can only approach the stream rate by computing less.
//
// f16s is f16 in the shifted coding MatmulKernel places f16 in when every |w| < 128
// (kernels/assembly/f16.ts' THE SHIFTED F16), f16 the plain coding it falls back to.
//
// WALK=streams runs the job as a decode's chunks walk it (dispatch.ts' THE STREAMS: four runs in
// step; for 2 to 7 rows the small-batch walks), N=4096 sets the columns (8B's w1/w3), HUGE=1
// advises the memory for 2 MiB pages as the engine does (huge-pages.ts), so the DRAM rate is
// the engine's; PLACES=l2,l3 limits where the matrix is put.
//
//   bun bench/kernel-bounds.ts     (DTYPES=f16,f16s,bf16,f32,q8_0,q4_k,q6_k ROWS=1,8,512 NORMAL_ONLY=1)
// JSON to bench/results/kernel-bounds.json (OUT=name for kernel-bounds.<name>.json).
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { J_D, J_FN, J_N, J_R0, J_ROWS, J_W, J_X, J_Y, JOB_INTS, type KernelExports } from "../src/model/compute/kernel-exports.ts";
import { adviseHugePages } from "../src/model/compute/huge-pages.ts";
import { F16_SHIFTED, KERNEL_INDEX } from "../src/model/compute/kernel-threads.ts";
import { kernelModule } from "../src/model/compute/matmul.ts";
import { f16Shift } from "../src/model/compute/f16-bits.ts";
import { castMatrix, type DType, type PackedMatrix } from "../src/model/compute/packed.ts";
import { packStrips, stripLayoutBytes } from "../src/model/compute/strip-layout.ts";
import { gaussianSource } from "./gguf-shapes.ts";
import { loadAverage, median } from "./stats.ts";

type Dt = "f16" | "f16s" | "bf16" | "f32" | "q8_0" | "q4_k" | "q6_k" | "q5_k";
const DTYPES = (process.env.DTYPES ?? "f16,f16s,bf16,f32,q8_0,q4_k,q6_k").split(",") as Dt[];
/** The file dtype whose strip layout dt's matrix has (f16s: f16's). */
const layoutOf = (dt: Dt): DType => (dt === "f16s" ? "f16" : dt);
const ROWS = (process.env.ROWS ?? "1,8,512").split(",").map(Number);
const N = Number(process.env.N ?? 2048);
const STREAMS_WALK = process.env.WALK === "streams";
const HUGE = process.env.HUGE === "1";
const NORMAL_ONLY = process.env.NORMAL_ONLY === "1";
/**
 * WEIGHTS=gauss: independent Gaussian weights of a trained layer's spread (sigma 0.02), 0.24% of
 * them f16 subnormals each on its own, where the default pattern's 0.08% come in runs at its
 * zero crossings and so share vectors (an assist is paid per multiply, not per lane).
 */
const GAUSS = process.env.WEIGHTS === "gauss";
// l3 at 256 MB stays within the AMD EPYC's L3 (the 135M shape's weights between tokens); the
// Intel Xeon's 480 MB L3 is a VM's view, and 128 MB there already runs at DRAM's rate, so
// PLACES=l2,l3_32m,dram puts a matrix in its L3 too.
const ALL_PLACES = { l2: 1 << 20, l3_32m: 32 << 20, l3: 256 << 20, dram: 1 << 30 } as const;
const PLACES = Object.fromEntries(Object.entries(ALL_PLACES).filter(([k]) => (process.env.PLACES ?? "l2,l3,dram").split(",").includes(k))) as Partial<
  typeof ALL_PLACES
>;

interface Rate {
  wallGBs: number;
  cpuGBs: number;
  cpuGmacs: number;
}

/** d rows of N weights placed in a kernel memory of their own (weights from a fixed pattern). */
function placed(dt: Dt, d: number, rows: number): { ex: KernelExports; job: number; scratch: number } {
  const bytes = stripLayoutBytes(layoutOf(dt), d, N);
  const top = 65536 + bytes + rows * (N + d) * 4 + 32 * N * 4 + JOB_INTS * 4;
  const memory = new WebAssembly.Memory({ initial: Math.ceil(top / 65536) + 1, maximum: 65536, shared: true });
  if (HUGE && !adviseHugePages(memory, 65536 * 65536)) throw new Error("HUGE=1: this host gives no transparent huge pages");
  const ex = new WebAssembly.Instance(kernelModule()!, { env: { memory } }).exports as unknown as KernelExports;
  // Room for x quantized as the kernel lays it out (its own row bytes), past everything else.
  const xqBytes = dt === "q8_0" ? rows * ex.q8_row_bytes(N) : dt.startsWith("q") ? rows * ex.k_row_bytes(N) : 0;
  memory.grow(Math.ceil(xqBytes / 65536));
  const u8 = new Uint8Array(memory.buffer);
  const w = 65536;
  // Filled a strip-sized slice at a time, so a 1 GiB matrix never exists twice.
  const slice = 8 * 64;
  // About 0.08% of these fall below f16's smallest normal (2^-14), as ~0.2% of a trained model's
  // do; NORMAL_ONLY=1 lifts them to 2^-13 to show what those subnormals cost the f16 kernel.
  const gauss = gaussianSource(12345);
  const src = new Float32Array(slice * N).map((_, i) => {
    const v = GAUSS ? gauss.next() : Math.sin(i * 0.37) * 0.05;
    return NORMAL_ONLY && Math.abs(v) < 2 ** -13 ? Math.sign(v || 1) * 2 ** -13 : v;
  });
  let m = dt === "f32" ? src : (castMatrix(src, layoutOf(dt), N) as PackedMatrix);
  if (dt === "f16s") {
    // The shifted patterns packed as bf16, whose strips lie out 16-bit patterns as f16's do
    // (packStrips would refuse a shifted pattern of 64 or more as an f16 inf; these stay below).
    const u = new Uint16Array((m as PackedMatrix).bytes.buffer);
    for (let i = 0; i < u.length; i++) u[i] = f16Shift(u[i]!);
    m = { ...(m as PackedMatrix), dtype: "bf16" };
  }
  for (let r = 0; r < d; r += slice) packStrips(m, 0, Math.min(slice, d - r), N, u8, w + stripLayoutBytes(layoutOf(dt), r, N));
  const x = w + bytes;
  const xf = new Float32Array(memory.buffer, x, rows * N);
  for (let i = 0; i < xf.length; i++) xf[i] = Math.cos(i * 0.11);
  const y = x + rows * N * 4;
  const scratch = y + rows * d * 4;
  // The job record the kernel takes (kernel-exports.ts' J_ slots; fn and r0 stay 0), past the
  // scratch, then x quantized for the kernels that take it so.
  const job = scratch + 32 * N * 4;
  const xq = job + JOB_INTS * 4;
  if (dt === "q8_0") ex.quantize_q8_x(xq, x, rows, N);
  else if (dt.startsWith("q")) ex.quantize_k_x(xq, x, rows, N);
  const rec = new Int32Array(memory.buffer, job, JOB_INTS);
  rec[J_Y] = y;
  rec[J_X] = dt.startsWith("q") ? xq : x;
  rec[J_W] = w;
  rec[J_ROWS] = rows;
  rec[J_N] = N;
  rec[J_D] = d;
  // The streams walk picks its kernel by the job's fn: f16s is a kernel of its own, not f16's.
  rec[J_FN] = dt === "f16s" ? F16_SHIFTED : KERNEL_INDEX[dt];
  rec[J_R0] = 0;
  return { ex, job, scratch };
}

function rate(dt: Dt, place: keyof typeof PLACES, rows: number): Rate {
  const es = stripLayoutBytes(layoutOf(dt), 8, N) / (8 * N);
  // Prefill's 512 rows take long: its matrices are 64x smaller (the kernel reads each strip from cache anyway).
  // The streams walk cuts its job in chunks of a multiple of 32 rows, as KernelThreads does.
  const unit = STREAMS_WALK ? 128 : 8;
  const d = Math.max(2 * unit, Math.floor(ALL_PLACES[place] / (N * es) / (rows >= 64 ? 64 : 1) / unit) * unit);
  const { ex, job, scratch } = placed(dt, d, rows);
  const fn = ex[`matmul_${dt}`];
  // 24 chunks of a multiple of 32 rows: four runs a quarter of the matrix apart, each a chunk's
  // piece after another, as a decode's thread takes its chunks in order.
  const per = Math.ceil(d / 24 / 32) * 32;
  const run = STREAMS_WALK ? (): void => ex.matmul_one_token(job, per, scratch) : (): void => fn(job, 0, d, scratch);
  // Warm up for a second, not one call: JavaScriptCore compiles the optimized tier of a large
  // kernel on another thread for a while, and a round timed before it lands measures the baseline tier.
  for (const t0 = performance.now(); performance.now() - t0 < 1000; ) run();
  const macs = rows * N * d;
  const reps = Math.max(1, Math.round(2e8 / macs));
  const wall: number[] = [];
  const cpu: number[] = [];
  for (let round = 0; round < 5; round++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) run();
    const c = process.cpuUsage(c0);
    wall.push((performance.now() - t0) / reps);
    cpu.push((c.user + c.system) / 1000 / reps);
  }
  const bytes = stripLayoutBytes(layoutOf(dt), d, N);
  const cpuMs = median(cpu);
  return { wallGBs: bytes / median(wall) / 1e6, cpuGBs: bytes / cpuMs / 1e6, cpuGmacs: macs / cpuMs / 1e6 };
}

const out: Record<string, unknown> = {
  bench: "kernel-bounds",
  cpu: cpus()[0]?.model,
  n: N,
  walk: STREAMS_WALK ? "streams" : "strips",
  hugePages: HUGE,
  normalOnly: NORMAL_ONLY,
  weights: GAUSS ? "gauss" : "sin",
  loadBefore: loadAverage(),
};
/**
 * Whether a decode's chunks walk dt's job of `rows` token rows as THE STREAMS (dispatch.ts'
 * runChunk): one row of any dtype, 2 to 7 of an integer one, 2 or 3 of a 16-bit one. Other counts
 * go through matmul_one_token's walk only as far as its kernels expect (a 16-bit one computes
 * three rows of four), so WALK=streams skips them.
 */
function streamed(dt: Dt, rows: number): boolean {
  if (rows === 1) return true;
  if (dt === "f32") return false;
  return dt.startsWith("q") ? rows < 8 : rows < 4;
}

const table: Record<string, Record<string, Rate>> = {};
for (const rows of ROWS) {
  for (const dt of DTYPES) {
    if (STREAMS_WALK && !streamed(dt, rows)) {
      console.log(`${dt} x${rows}: not a streams walk in the engine, skipped`);
      continue;
    }
    const key = `${dt} x${rows}`;
    table[key] = {};
    for (const place of Object.keys(PLACES) as (keyof typeof PLACES)[]) {
      if (rows >= 64 && place !== "l2") continue;
      const r = rate(dt, place, rows);
      table[key][place] = r;
      console.log(
        `${key.padEnd(10)} ${place.padEnd(5)} ${r.cpuGBs.toFixed(2)} GB/s (${r.cpuGmacs.toFixed(2)} GMAC/s) per CPU-s, ${r.wallGBs.toFixed(2)} GB/s wall`,
      );
    }
  }
}
// The serial model at one row: wait for the bytes at f32's DRAM rate, then compute at the in-L2 rate.
const stream = table["f32 x1"]?.dram?.cpuGBs;
const serial: Record<string, { predictedGBs: number; measuredGBs: number }> = {};
if (stream !== undefined) {
  for (const dt of DTYPES) {
    const t = table[`${dt} x1`];
    if (t?.l2 === undefined || t.dram === undefined) continue;
    const predictedGBs = 1 / (1 / t.l2.cpuGBs + 1 / stream);
    serial[dt] = { predictedGBs, measuredGBs: t.dram.cpuGBs };
    console.log(
      `${dt} x1 from DRAM: serial model ${predictedGBs.toFixed(2)} GB/s per CPU-s (in L2 ${t.l2.cpuGBs.toFixed(2)}, f32 stream ${stream.toFixed(2)}), measured ${t.dram.cpuGBs.toFixed(2)}`,
    );
  }
}
out.rates = table;
out.serial = serial;
out.loadAfter = loadAverage();
console.log(`load average ${out.loadBefore} -> ${out.loadAfter}`);
const dir = join(import.meta.dir, "results");
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, process.env.OUT ? `kernel-bounds.${process.env.OUT}.json` : "kernel-bounds.json"), `${JSON.stringify(out, null, 2)}\n`);
