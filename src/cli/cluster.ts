import { createServer } from "node:net";
import { quote } from "../codec/index.ts";
import { log } from "../obs/index.ts";
import { printClusterUp } from "./cluster-banner.ts";
import { demo } from "./cluster-demo.ts";
import { clusterFlags } from "./cluster-flags.ts";
import { startGateways } from "./cluster-gateways.ts";
import { ClusterProcesses } from "./cluster-processes.ts";
import { ConfigError, parseAddr, type Config } from "./options.ts";
import { ANY_PORT, roleArgs } from "./spawn-role.ts";
import { stopRequests } from "./stop-requests.ts";

function tryPort(port: number, host = "127.0.0.1"): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(port, host, () => {
      const bound = (s.address() as { port: number }).port;
      s.close(() => resolve(bound));
    });
  });
}

const DEFAULT_FRONT_PORT = 8000;

/**
 * Where the gateway listens: the address asked for (which must be free now: an error
 * before anything starts), else `preferred` on loopback when it is free, else a port the
 * OS picks, with `busy` saying which port was taken.
 */
export async function frontDoor(asked: string | null, preferred = DEFAULT_FRONT_PORT): Promise<{ listen: string; busy: number | null }> {
  if (asked !== null) {
    const { host, port } = parseAddr(asked, "--http-listen");
    try {
      await tryPort(port, host);
      return { listen: asked, busy: null };
    } catch (e) {
      throw new ConfigError(`--http-listen ${asked}: cannot listen there (${e instanceof Error ? e.message : String(e)})`);
    }
  }
  try {
    return { listen: `127.0.0.1:${await tryPort(preferred)}`, busy: null };
  } catch {
    return { listen: ANY_PORT, busy: preferred };
  }
}

export const busyNote = (busy: number, http: string) => `port ${busy} is busy; the gateway listens on ${http} instead (--http-listen picks one)`;

/**
 * `engine cluster`: a gateway, N prefill and M decode engines, each its own process on
 * loopback, as in production; one demo request; then serve until Ctrl-C. With
 * `--gateways G` (G > 1) there are G gateway replicas, each on ports of its own, behind one
 * front port: a round-robin TCP proxy in this process (tcp-front.ts), as a Service would
 * be; every engine beats to every replica. Whatever it started is in `procs`, and the one
 * catch stops exactly that.
 */
export async function runCluster(config: Config, rest: Map<string, string>, opts: { demo?: boolean; wait?: boolean } = {}) {
  const { nP, nD, nG, plaintext } = clusterCounts(rest);
  // Every option is passed on to the processes it concerns or refused here, before anything starts.
  const flags = clusterFlags(config);
  if (nG > 1 && flags.registryListen !== null) {
    throw new ConfigError("--registry-listen: with --gateways above 1 each replica's registry takes a port of its own");
  }
  const auth = demoAuth(config.engine.api_key);
  // Asked for from the start: a signal, or the parent (npm, a shell, a supervisor) dying, during start-up stops it too.
  const stopped = (opts.wait ?? true) ? stopRequests(process.ppid) : null;
  const door = await frontDoor(flags.httpListen);
  const procs = await ClusterProcesses.create(plaintext, { gateway: nG, prefill: nP, decode: nD });
  let up = false;
  void stopped?.then(async () => {
    if (up) return;
    await procs.stopAll();
    process.exit(1);
  });
  try {
    // The cluster shows the prefill → decode hand-off: every request crosses it unless the user sets a threshold.
    const disaggregate = config.given.has("gateway.disagg_min_uncached_tokens") ? [] : ["--disagg-min-uncached-tokens", "0"];
    const gw = await startGateways(nG, door, flags, (i) => [...disaggregate, "--routing-headers", ...procs.tlsArgs(`gateway-${i}`)], procs);
    const note = gw.busy === null ? null : busyNote(gw.busy, String(gw.front.http));
    if (note) log.warn(note);
    const registries = gw.replicas.map((r) => parseAddr(String(r.registry))).map((a) => `${loopback(a.host)}:${a.port}`);
    // Engines bind ports the OS picks and say which in their ready lines and heartbeats; each beats to every replica.
    const engineArgs = (role: "prefill" | "decode", i: number) =>
      roleArgs(role, ["--worker-id", `${role}-${i}`, "--gateway-registry", registries.join(","), ...flags.engines, ...procs.tlsArgs(`${role}-${i}`)]);
    for (let i = 0; i < nP; i++) procs.start(`prefill-${i}`, engineArgs("prefill", i));
    for (let i = 0; i < nD; i++) procs.start(`decode-${i}`, engineArgs("decode", i));
    const ready = await Promise.all(procs.children.map((c) => c.ready));
    const http = parseAddr(String(gw.front.http));
    const base = `http://${loopback(http.host)}:${http.port}`;
    await untilRegistriesList(gw.replicas, nP, nD, auth);
    const print = (s: string) => process.stdout.write(s + "\n");
    printClusterUp(print, { ready, pki: procs.pki, front: procs.front?.address ?? null, gateways: nG, note, base, auth });
    // Any engine also serves a request whole when no hand-off header comes with it.
    const colocatedHttp = ready.find((r) => r.role === "decode")?.http;
    const beatMs = nG > 1 ? config.gateway.heartbeat_interval_ms : 0;
    if (opts.demo ?? true) await demo(base, colocatedHttp === undefined ? undefined : String(colocatedHttp), print, auth, beatMs);
    up = true;
    if (stopped) {
      print("\nserving; Ctrl-C stops every process");
      log.info("stopping", { signal: await stopped });
      print("stopping...");
      await procs.stopAll();
    }
    return { base, httpPort: http.port, regPort: parseAddr(String(gw.front.registry)).port, stop: () => procs.stopAll(), children: procs.children };
  } catch (err) {
    await procs.stopAll();
    throw err;
  }
}

/** --prefill, --decode, --gateways (1..16 each) and --plaintext; any other cluster-only option is refused. */
function clusterCounts(rest: Map<string, string>): { nP: number; nD: number; nG: number; plaintext: boolean } {
  const count = (k: string, d: number) => {
    const v = rest.get(k);
    if (v === undefined) return d;
    if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 16) throw new ConfigError(`--${k}: want 1..16, got ${quote(v)}`);
    return Number(v);
  };
  const counts = { nP: count("prefill", 1), nD: count("decode", 2), nG: count("gateways", 1) };
  for (const k of rest.keys()) if (!["prefill", "decode", "gateways", "plaintext"].includes(k)) throw new ConfigError(`unknown option --${k}`);
  return { ...counts, plaintext: rest.get("plaintext") === "true" };
}

/** The API keys reach every child (the option through clusterFlags, TL_API_KEY through the environment); the demo sends the first. */
function demoAuth(apiKeys: readonly string[]): Record<string, string> {
  const env = process.env.TL_API_KEY;
  const key = apiKeys[0] ?? (env ? env.split(",")[0]!.trim() : undefined);
  return key !== undefined ? { authorization: `Bearer ${key}` } : {};
}

const loopback = (h: string) => (h === "0.0.0.0" ? "127.0.0.1" : h);

/** Ready lines say the servers are up; every replica's registry listing the engines says routing can begin. */
async function untilRegistriesList(replicas: readonly Record<string, unknown>[], nP: number, nD: number, auth: Record<string, string>): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (const r of replicas) {
    for (;;) {
      const h = (await (await fetch(`http://${String(r.http)}/health`, { headers: auth })).json()) as { workers: { prefill: number; decode: number } };
      if (h.workers.prefill === nP && h.workers.decode === nD) break;
      if (Date.now() > deadline) throw new Error(`registry lists ${JSON.stringify(h.workers)}, want ${nP} prefill and ${nD} decode`);
      await Bun.sleep(50);
    }
  }
}
