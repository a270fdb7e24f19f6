// KV transfer throughput and latency (issue 3): 1,000 blocks of the default engine
// shape pushed over loopback, by gRPC (Connect) and by the binary data plane, beside
// raw TCP (Bun sockets) moving the same bytes in the same run; the dedup case (warm D);
// p50/p99 per-push latency of a 2k-token prompt. The push is measured from blocks
// adjacent in P's pool (a fresh engine's allocation: payloads go to the socket straight
// from the pool) and from scattered ones (every payload copied into the send buffer).
// Writes bench/results/transfer.json.
//
// Everything runs twice:
// - crossProcess: D (KvReceiver + serveKv, and the raw TCP sink) runs in a child
//   process (bench/transfer-sink.ts), as a decode engine does in a deployment, so both
//   sides' work overlaps on separate cores. This is the number the target applies to.
// - inProcess: P and D share this process and its one JS thread, which then does both
//   sides' CRCs and copies, while the raw TCP baseline only copies through the kernel.
// Each repetition times raw TCP and both pushes back to back, and ratios are taken per
// repetition (then the median), so a busy moment on the shared machine hits both.
import { listenRawSink } from "./raw-sink.ts";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Socket } from "bun";
import { envelopeBytes, promptHashes, type KvShape } from "../src/codec/index.ts";
import { KvPool } from "../src/pool/index.ts";
import { DataPlaneClient, KvReceiver, RoutingTransport, serveKv, transfer } from "../src/transfer/index.ts";
import { poolChunks } from "../src/transfer/build-chunks.ts";

const SHAPE: KvShape = { blockTokens: 16, nLayers: 4, nKvHeads: 4, headDim: 32 };
const BLOCKS = 1000;
const REPS = Number(process.env.BENCH_REPS ?? 15);
/**
 * Untimed repetitions first: a decode engine in service has run its receive path many
 * times over, and JavaScriptCore moves it to its optimizing tiers only after it has run
 * a while (on 2 cores the compiler threads also take CPU from the push). Measured here
 * with a fresh D per path: the first ~10 pushes take about twice as long as later ones.
 */
const WARMUP = Number(process.env.BENCH_WARMUP ?? 12);
const LAT_PUSHES = Number(process.env.BENCH_LAT_PUSHES ?? 100);
const LAT_TOKENS = 2048;
const E = envelopeBytes(SHAPE, 1);
const BYTES = BLOCKS * E;
/** The raw sender's write size; the data plane client stages 1 MiB per write too. */
const RAW_WRITE = 1024 * 1024;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}
function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
}
const gbps = (ms: number) => BYTES / ms / 1e6;
const round = (x: number, d = 3) => Number(x.toFixed(d));

interface Prompt {
  pool: KvPool;
  ids: number[];
  hashes: bigint[];
}

/**
 * P's pool: full blocks of pseudo-random f16 data, registered under a prompt's hashes.
 * With `stride` 1 the blocks are adjacent in the pool, as a fresh engine allocates them
 * (the data plane then sends payloads straight from the pool); with 2, no two are (every
 * payload is copied into the send buffer, as after long churn).
 */
function prefill(pool: KvPool, nTokens: number, seed: number, stride = 1): Prompt {
  const tokens = Array.from({ length: nTokens }, (_, i) => (Math.imul(i + seed, 2654435761) >>> 0) % 32000);
  const hashes = promptHashes(tokens, SHAPE.blockTokens);
  const n = Math.ceil(nTokens / SHAPE.blockTokens);
  const all = pool.allocate(n * stride)!;
  const ids = all.filter((_, i) => i % stride === 0);
  pool.releaseAll(all.filter((_, i) => i % stride !== 0));
  const w = new Uint32Array(pool.data.buffer);
  for (let b = 0; b < ids.length; b++) {
    const base = (ids[b]! * pool.blockBytes) / 4;
    // finite f16 pairs (exponent < 31): low 14 bits of each half
    for (let i = 0; i < pool.blockBytes / 4; i++) w[base + i] = (Math.imul(i + b * 7919 + seed, 0x9e3779b1) >>> 0) & 0x3fff3fff;
    pool.setFill(ids[b]!, Math.min(SHAPE.blockTokens, nTokens - b * SHAPE.blockTokens));
    if (b < hashes.length) pool.register(ids[b]!, hashes[b]!);
  }
  return { pool, ids, hashes };
}

function evictAll(pool: KvPool): void {
  const ids = pool.allocate(pool.free + pool.cached);
  if (ids !== null) pool.releaseAll(ids);
}

function ownCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** The receiving side, here or in a child process. */
interface Sink {
  readonly address: string;
  /** CPU ms the sink's process spent so far; 0 in process (this process's clock has it). */
  cpuMs(): Promise<number>;
  evict(): Promise<void>;
  release(handleId: string): Promise<void>;
  close(): Promise<void>;
}

/** bench/transfer-sink.ts in a child process, driven by one command per stdin line. */
async function childSink(args: string[]): Promise<Sink> {
  const proc = Bun.spawn([process.execPath, join(import.meta.dir, "transfer-sink.ts"), ...args], {
    stdin: "pipe",
    stdout: "pipe",
    stderr: "inherit",
  });
  const reader = proc.stdout.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  const line = async (): Promise<Record<string, unknown>> => {
    for (;;) {
      const nl = buf.indexOf("\n");
      if (nl >= 0) {
        const l = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        return JSON.parse(l) as Record<string, unknown>;
      }
      const r = await reader.read();
      if (r.done) throw new Error(`transfer-sink ${args.join(" ")} exited`);
      buf += decoder.decode(r.value, { stream: true });
    }
  };
  const ask = async (cmd: string) => {
    proc.stdin.write(cmd + "\n");
    proc.stdin.flush();
    return line();
  };
  const hello = await line();
  return {
    address: String(hello.address),
    async cpuMs() {
      return Number((await ask("cpu")).cpuMs);
    },
    async evict() {
      await ask("evict");
    },
    async release(id) {
      await ask(`release ${id}`);
    },
    async close() {
      proc.stdin.write("exit\n");
      proc.stdin.end();
      await proc.exited;
    },
  };
}

async function localKvSink(): Promise<Sink> {
  const pool = new KvPool(SHAPE, BLOCKS + 200);
  const rx = new KvReceiver(pool, { maxPending: 4096 });
  const server = await serveKv(rx);
  return {
    address: server.address,
    cpuMs: async () => 0,
    async evict() {
      evictAll(pool);
    },
    async release(id) {
      rx.release(id);
    },
    async close() {
      await server.close();
      rx.close();
    },
  };
}

/** The same sink as transfer-sink.ts' raw mode, in this process. */
async function localRawSink(total: number): Promise<Sink> {
  const listener = listenRawSink(total);
  return {
    address: `127.0.0.1:${listener.port}`,
    cpuMs: async () => 0,
    async evict() {},
    async release() {},
    async close() {
      listener.stop(true);
    },
  };
}

/** Raw TCP sender: one connection, RAW_WRITE-byte writes honouring backpressure, until the sink's byte. */
async function rawSender(address: string): Promise<{ send(total: number): Promise<void>; close(): void }> {
  let answered: () => void = () => {};
  let drained: () => void = () => {};
  const i = address.lastIndexOf(":");
  const sock: Socket<undefined> = await Bun.connect({
    hostname: address.slice(0, i),
    port: Number(address.slice(i + 1)),
    socket: {
      data() {
        answered();
      },
      drain() {
        drained();
      },
    },
  });
  sock.setNoDelay(true);
  const chunk = new Uint8Array(RAW_WRITE).fill(7);
  return {
    async send(total) {
      const done = new Promise<void>((res) => (answered = res));
      let sent = 0;
      while (sent < total) {
        const n = Math.min(chunk.length, total - sent);
        let off = 0;
        while (off < n) {
          const w = sock.write(chunk.subarray(off, n));
          off += Math.max(0, w);
          if (off < n) await new Promise<void>((res) => (drained = res));
        }
        sent += n;
      }
      await done;
    },
    close() {
      sock.end();
    },
  };
}

interface Timed {
  ms: number;
  /** CPU ms of both processes (or of the one) */
  cpuMs: number;
}

async function timed(sinks: Sink[], f: () => Promise<void>): Promise<Timed> {
  const s0 = await Promise.all(sinks.map((s) => s.cpuMs()));
  const c0 = ownCpuMs();
  const t0 = performance.now();
  await f();
  const ms = performance.now() - t0;
  const c = ownCpuMs() - c0;
  const s1 = await Promise.all(sinks.map((s) => s.cpuMs()));
  return { ms, cpuMs: c + s1.reduce((a, x, k) => a + x - s0[k]!, 0) };
}

function summary(xs: Timed[], raw: Timed[]) {
  const ms = median(xs.map((x) => x.ms));
  return {
    ms: round(ms, 2),
    gbps: round(gbps(ms)),
    /** median over repetitions of raw ms / this ms, each pair measured back to back */
    ratioToRawTcp: round(median(xs.map((x, k) => raw[k]!.ms / x.ms))),
    cpuMs: round(median(xs.map((x) => x.cpuMs)), 1),
    /** raw TCP's CPU ms (both sides) / this CPU ms (both sides) */
    cpuRatioToRawTcp: round(median(xs.map((x, k) => raw[k]!.cpuMs / x.cpuMs))),
    runsMs: xs.map((x) => round(x.ms, 1)),
  };
}

type Path = "dataPlane" | "grpc";

/**
 * One path measured against raw TCP, with a D of its own (a decode engine receives by
 * one path; a gRPC push's garbage would otherwise be collected during the next data
 * plane push, and the reverse).
 */
async function measurePath(path: Path, crossProcess: boolean, big: Prompt, small: Prompt, scattered: Prompt) {
  const P = big.pool;
  const dims = `${SHAPE.blockTokens},${SHAPE.nLayers},${SHAPE.nKvHeads},${SHAPE.headDim}`;
  const rawSink = crossProcess ? await childSink(["raw", String(BYTES)]) : await localRawSink(BYTES);
  const kv = crossProcess ? await childSink(["kv", String(BLOCKS), dims]) : await localKvSink();
  const raw = await rawSender(rawSink.address);
  const t = new RoutingTransport({ dataPlane: path === "dataPlane" ? new DataPlaneClient({ timeoutMs: 60_000 }) : false, timeoutMs: 60_000 });
  let h = 0;
  // One envelope buffer for every push, as transfer() reuses its own: a fresh 32 MB
  // buffer per push would time page faults, not the transfer.
  const slab = new Uint8Array(BYTES);
  const notPresent = big.hashes.map(() => false);

  // A cold push as transfer() makes it, without HasBlocks: chunks from P's pool (the
  // envelopes are written by the transport, into its send buffer or the slab) and PushKv.
  const { route } = await t.hasBlocks(kv.address, [], 1);
  if ((route.via === "data-plane") !== (path === "dataPlane")) throw new Error(`${path}: wrong transport`);
  const push = async (from: Prompt): Promise<Timed> => {
    const id = `push-${h++}`;
    let blocks = 0;
    const r = await timed([kv], async () => {
      const ack = await t.push(route, poolChunks(from.pool, id, from.ids, from.hashes, notPresent, slab));
      blocks = ack.blocksReceived;
    });
    if (blocks !== BLOCKS) throw new Error(`${path}: ${blocks} blocks received`);
    await kv.release(id);
    await kv.evict();
    return r;
  };
  const rawRun = () => timed([rawSink], () => raw.send(BYTES));

  const rawRuns: Timed[] = [];
  const pushRuns: Timed[] = [];
  const scatteredRuns: Timed[] = [];
  // A repetition: one untimed raw run (the machine wakes up slowly after a pause: the
  // first run after one is up to 3x slower), then raw, push, raw back to back. The
  // baseline of a repetition is the faster of its two raw runs, so it is never
  // flattered by a slow moment. The first WARMUP repetitions warm connections and the
  // JIT and are dropped. No forced garbage collection: after one, the allocator hands its pages
  // back and every fresh socket read buffer page-faults (about 7,000 faults, +100 ms, per
  // 32 MB received on this VM), which would charge whichever side runs next.
  for (let r = 0; r < WARMUP + REPS; r++) {
    await raw.send(BYTES);
    const rawA = await rawRun();
    const x = await push(big);
    const y = await push(scattered);
    const rawB = await rawRun();
    if (r < WARMUP) continue;
    rawRuns.push(rawA.ms <= rawB.ms ? rawA : rawB);
    pushRuns.push(x);
    scatteredRuns.push(y);
  }
  const rawMs = median(rawRuns.map((x) => x.ms));

  // Whole transfer() (HasBlocks + envelope writing + push), cold and warm D.
  const whole = async (warm: boolean) => {
    const times: number[] = [];
    let last = { blocksSent: 0, blocksDeduped: 0, payloadBytes: 0, nTokens: 0 };
    for (let r = 0; r < REPS + 1; r++) {
      const id = `whole-${h++}`;
      for (const b of big.ids) P.acquire(b);
      const t0 = performance.now();
      last = await transfer(t, kv.address, P, id, big.ids, big.hashes);
      const ms = performance.now() - t0;
      if (r > 0) times.push(ms);
      await kv.release(id);
      if (!warm) await kv.evict();
    }
    return { ms: round(median(times), 2), stats: last };
  };
  const cold = await whole(false);
  await whole(true); // D now caches every full block of the prompt
  const warm = await whole(true);
  await kv.evict();

  // p50/p99 per push of a 2k-token prompt (128 blocks), cold D.
  const lat: number[] = [];
  for (let r = 0; r < LAT_PUSHES + 10; r++) {
    const id = `lat-${h++}`;
    for (const b of small.ids) P.acquire(b);
    const t0 = performance.now();
    await transfer(t, kv.address, P, id, small.ids, small.hashes);
    const ms = performance.now() - t0;
    if (r >= 10) lat.push(ms);
    await kv.release(id);
    await kv.evict();
  }

  raw.close();
  await t.close();
  await kv.close();
  await rawSink.close();
  return {
    // the same push from blocks no two of which are adjacent in P's pool
    pushScattered: summary(scatteredRuns, rawRuns),
    push: {
      ...summary(pushRuns, rawRuns),
      rawTcpMs: round(rawMs, 2),
      rawTcpGbps: round(gbps(rawMs)),
      rawTcpCpuMs: round(median(rawRuns.map((x) => x.cpuMs)), 1),
      rawRunsMs: rawRuns.map((x) => round(x.ms, 1)),
    },
    transferCold: { ...cold, gbps: round(gbps(cold.ms)), ratioToRawTcp: round(rawMs / cold.ms) },
    transferWarm: { ...warm, speedupOverCold: round(cold.ms / warm.ms, 1) },
    latency2kTokens: { pushes: LAT_PUSHES, p50: round(pct(lat, 50), 2), p99: round(pct(lat, 99), 2) },
  };
}

async function run(crossProcess: boolean) {
  const P = new KvPool(SHAPE, BLOCKS + 200);
  const big = prefill(P, BLOCKS * SHAPE.blockTokens, 1);
  const small = prefill(P, LAT_TOKENS, 2);
  const scattered = prefill(new KvPool(SHAPE, 2 * BLOCKS), BLOCKS * SHAPE.blockTokens, 1, 2);
  return {
    dataPlane: await measurePath("dataPlane", crossProcess, big, small, scattered),
    grpc: await measurePath("grpc", crossProcess, big, small, scattered),
  };
}

const crossProcess = await run(true);
const inProcess = await run(false);
const result = {
  shape: SHAPE,
  blocks: BLOCKS,
  envelopeBytes: E,
  bytes: BYTES,
  reps: REPS,
  rawWriteBytes: RAW_WRITE,
  // Bun's allocator (mimalloc) hands freed pages back after this delay (ms; -1 never);
  // each fresh socket read buffer then page-faults, on raw TCP and the pushes alike.
  mimallocPurgeDelay: process.env.MIMALLOC_PURGE_DELAY ?? "default",
  // push: chunks built from P's pool and pushed (envelope writing included), cold D.
  // ratioToRawTcp: wall time; cpuRatioToRawTcp: CPU time of sender and receiver together.
  crossProcess,
  inProcess,
};
console.log(JSON.stringify(result, null, 2));
console.log(
  `push / raw TCP: data plane ${crossProcess.dataPlane.push.ratioToRawTcp} cross-process (${crossProcess.dataPlane.pushScattered.ratioToRawTcp} from scattered blocks), ` +
    `${inProcess.dataPlane.push.ratioToRawTcp} in one process (${inProcess.dataPlane.pushScattered.ratioToRawTcp}); ` +
    `gRPC ${crossProcess.grpc.push.ratioToRawTcp} / ${inProcess.grpc.push.ratioToRawTcp}`,
);
const dir = join(import.meta.dir, "results");
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, "transfer.json"), JSON.stringify(result, null, 2) + "\n");
