// Where batch-1 decode time goes: whole forward vs time inside MatmulKernel.matmul (kernel +
// thread handoff) vs the rest of forward (JS), per dtype and thread count; plus the kernel
// alone (single thread, the same 43 calls in the same order) and the bare handoff round trip.
import { KvPool } from "../src/pool/index.ts";
import { type DType, type ModelConfig, Transformer, castWeights, kvShapeOf, syntheticWeights } from "../src/model/index.ts";
import { MatmulKernel } from "../src/model/matmul.ts";

const cfg: ModelConfig = {
  name: "ts15m",
  dim: 288,
  hiddenDim: 768,
  nLayers: 6,
  nHeads: 6,
  nKvHeads: 6,
  vocabSize: 32000,
  maxSeqLen: 256,
  ropeTheta: 10000,
  normEps: 1e-5,
};
const dtypes = (process.env.DTYPES ?? "f32,f16,bf16,q8_0").split(",") as DType[];
const threadCounts = (process.env.THREADS ?? "1,2").split(",").map(Number);
const batch = Number(process.env.BATCH ?? 1);
const base = syntheticWeights(cfg, 15, { sharedClassifier: true });

for (const dt of dtypes) {
  const w = castWeights(cfg, base, dt);
  for (const threads of threadCounts) {
    const m = new Transformer(cfg, w, { threads });
    await m.ready();
    const mm = (m as unknown as { mm: MatmulKernel }).mm;
    const queue = mm.queue.bind(mm);
    const flush = mm.flush.bind(mm);
    let mmMs = 0;
    let calls = 0;
    let flushes = 0;
    const calls_: { n: number; d: number; rows: number; w: unknown; wOff: number }[] = [];
    let record = false;
    mm.queue = (y, x, ww, wOff, rows, n, d) => {
      const t = performance.now();
      queue(y, x, ww, wOff, rows, n, d);
      mmMs += performance.now() - t;
      calls++;
      if (record) calls_.push({ n, d, rows, w: ww, wOff });
    };
    mm.flush = () => {
      const t = performance.now();
      flush();
      mmMs += performance.now() - t;
      flushes++;
    };
    const pool = new KvPool(kvShapeOf(cfg, 16), 16 * batch + 1);
    const tables = Array.from({ length: batch }, () => pool.allocate(16)!);
    const out = new Float32Array(batch * cfg.vocabSize);
    const chunks = tables.map((t) => ({ blockTable: t, startPos: 0, tokens: [1] }));
    const stepOnce = (pos: number) => {
      for (let s = 0; s < batch; s++) {
        chunks[s]!.startPos = pos;
        chunks[s]!.tokens[0] = (pos * 31 + s) % cfg.vocabSize;
      }
      m.forward(pool, chunks, out);
    };
    for (let p = 0; p < 64; p++) stepOnce(p);
    record = true;
    stepOnce(64);
    record = false;
    mmMs = 0;
    calls = 0;
    flushes = 0;
    const steps = 192;
    const t0 = performance.now();
    for (let p = 64; p < 64 + steps; p++) stepOnce(p);
    const total = performance.now() - t0;
    const perTok = total / steps;
    const line = `${dt} threads=${threads} batch=${batch}: ${((1000 / perTok) * batch).toFixed(1)} tok/s; per step ${(perTok * 1000).toFixed(0)} us = matmul ${((mmMs / steps) * 1000).toFixed(0)} us (${calls / steps} matmuls in ${flushes / steps} dispatches) + rest ${(((total - mmMs) / steps) * 1000).toFixed(0)} us`;
    // Kernel alone on this thread: the same calls in order, via exports.
    const ex = mm.exports!;
    const fn = `matmul_${dt}` as const;
    const xAt = mm.addressOf(mm.alloc(batch * cfg.hiddenDim));
    const yAt = mm.addressOf(mm.alloc(batch * cfg.vocabSize));
    const sAt = mm.addressOf(mm.alloc(8 * cfg.hiddenDim));
    const jobs = calls_.map((c) => [mm.offsetOf(c.w as never), c.rows, c.n, c.d, c.wOff / c.n] as const);
    const runAll = () => {
      for (const [wAt, rows, n, d, r0] of jobs) ex[fn](yAt, xAt, wAt, rows, n, d, r0, r0, r0 + d, sAt);
    };
    for (let i = 0; i < 20; i++) runAll();
    const k0 = performance.now();
    const reps = 100;
    for (let i = 0; i < reps; i++) runAll();
    const kUs = ((performance.now() - k0) / reps) * 1000;
    let layerUs = 0;
    {
      const layerJobs = jobs.filter(([, , , d]) => d !== cfg.vocabSize);
      const k1 = performance.now();
      for (let i = 0; i < reps; i++) for (const [wAt, rows, n, d, r0] of layerJobs) ex[fn](yAt, xAt, wAt, rows, n, d, r0, r0, r0 + d, sAt);
      layerUs = ((performance.now() - k1) / reps) * 1000;
    }
    console.log(`${line}; kernel alone 1 thread ${kUs.toFixed(0)} us (layers ${layerUs.toFixed(0)}, classifier ${(kUs - layerUs).toFixed(0)})`);
    m.close();
  }
}
// The bare handoff: a split matmul that does almost nothing.
{
  const w = new Float32Array(16 * 4096).fill(0.5);
  const k = new MatmulKernel([{ matrix: w, cols: 16 }], { threads: 2 });
  await k.ready();
  const x = k.alloc(16),
    y = k.alloc(4096);
  const reps = 20000;
  let split = 1e9;
  let one = 1e9;
  const k1 = new MatmulKernel([{ matrix: w, cols: 16 }]);
  const x1 = k1.alloc(16),
    y1 = k1.alloc(4096);
  for (let round = 0; round < 5; round++) {
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) k.matmul(y, x, w, 0, 1, 16, 4096);
    split = Math.min(split, ((performance.now() - t0) / reps) * 1000);
    const t1 = performance.now();
    for (let i = 0; i < reps; i++) k1.matmul(y1, x1, w, 0, 1, 16, 4096);
    one = Math.min(one, ((performance.now() - t1) / reps) * 1000);
  }
  console.log(`16x4096 f32 matmul (64K MACs): 2 threads ${split.toFixed(2)} us, 1 thread ${one.toFixed(2)} us`);
  k.close();
}
