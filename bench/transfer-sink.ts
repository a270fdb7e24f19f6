// The receiving side of bench/transfer.ts in its own process, as a decode engine is in
// a deployment: both sides' CPU work then overlaps on separate cores instead of
// sharing one JS thread.
//
//   bun bench/transfer-sink.ts raw <total>   a TCP sink answering one byte per <total> bytes
//   bun bench/transfer-sink.ts kv <blocks> <B,L,H,D>   KvReceiver + serveKv (gRPC and
//                                            data plane) over a pool of that shape
// With TL_BENCH_TLS=<cert>:<key>:<ca> (PEM files) both serve over mutual TLS.
//
// The first stdout line is JSON with the listening address. Then one command per stdin
// line, one JSON answer per command on stdout:
//   cpu        {"cpuMs": n, "faults": n}   process CPU time (user + system) and minor
//                                          page faults so far
//   evict      {"ok": true}   kv only: every cached block of D's pool becomes free
//   release H  {"ok": bool}   kv only: frees pending handle H
//   exit       the process ends
import { KvPool } from "../src/pool/index.ts";
import { KvReceiver, serveKv } from "../src/transfer/index.ts";
import { listenRawSink } from "./raw-sink.ts";
import { TlsSource } from "../src/rpc/tls-config.ts";
import { readFileSync } from "node:fs";

const tlsFiles = process.env.TL_BENCH_TLS?.split(":");
const tls = tlsFiles ? new TlsSource({ cert: tlsFiles[0]!, key: tlsFiles[1]!, ca: tlsFiles[2]! }) : null;
const pem = tlsFiles
  ? { cert: readFileSync(tlsFiles[0]!, "utf8"), key: readFileSync(tlsFiles[1]!, "utf8"), ca: readFileSync(tlsFiles[2]!, "utf8") }
  : undefined;

const [mode, arg, dims] = process.argv.slice(2);
const say = (v: unknown) => process.stdout.write(JSON.stringify(v) + "\n");
const cpuMs = () => {
  const u = process.resourceUsage();
  return { cpuMs: (u.userCPUTime + u.systemCPUTime) / 1000, faults: u.minorPageFault };
};
let onCommand: (cmd: string, arg: string) => unknown;
let stop: () => Promise<void>;

if (mode === "raw") {
  const total = Number(arg);
  if (!(total > 0)) throw new Error(`raw sink needs a byte count, got ${arg}`);
  const listener = listenRawSink(total, pem);
  say({ address: `127.0.0.1:${listener.port}` });
  onCommand = (cmd) => {
    if (cmd === "cpu") return cpuMs();
    throw new Error(`raw sink: unknown command ${cmd}`);
  };
  stop = async () => {
    listener.stop(true);
  };
} else if (mode === "kv") {
  const [blockTokens, nLayers, nKvHeads, headDim] = (dims ?? "").split(",").map(Number) as [number, number, number, number];
  const pool = new KvPool({ blockTokens, nLayers, nKvHeads, headDim }, Number(arg) + 200);
  // One pusher (the bench) may hold the whole pool: it is the only peer.
  const rx = new KvReceiver(pool, { ttlMs: 60_000, pushIdleTimeoutMs: 10_000, maxPending: 4096, maxPendingPerPeer: 4096, maxBlocksPerPeer: pool.total });
  const server = await serveKv(rx, { tls });
  say({ address: server.address, dataPlane: server.dataPlaneAddress });
  onCommand = (cmd, a) => {
    if (cmd === "cpu") return cpuMs();
    if (cmd === "evict") {
      const ids = pool.allocate(pool.free + pool.cached);
      if (ids !== null) pool.releaseAll(ids);
      return { ok: true };
    }
    if (cmd === "release") return { ok: rx.release(a) };
    throw new Error(`kv sink: unknown command ${cmd}`);
  };
  stop = async () => {
    await server.close();
    rx.close();
  };
} else {
  throw new Error(`usage: transfer-sink.ts raw <bytes> | kv <blocks> <B,L,H,D>, got ${mode}`);
}

let pending = "";
const decoder = new TextDecoder();
for await (const part of Bun.stdin.stream()) {
  pending += decoder.decode(part, { stream: true });
  let nl: number;
  while ((nl = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, nl).trim();
    pending = pending.slice(nl + 1);
    if (line === "") continue;
    const sp = line.indexOf(" ");
    const cmd = sp < 0 ? line : line.slice(0, sp);
    if (cmd === "exit") {
      await stop();
      process.exit(0);
    }
    say(onCommand(cmd, sp < 0 ? "" : line.slice(sp + 1)));
  }
}
await stop();
