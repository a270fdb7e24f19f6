import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sseData } from "../http/index.ts";
import { SYNTHETIC_MODEL_NAME } from "../model/index.ts";
import { log } from "../obs/index.ts";
import { certFiles, mintCluster, writeCerts } from "./certs.ts";
import { clusterFlags, type ClusterFlags } from "./cluster-flags.ts";
import { ConfigError, parseAddr, type Config } from "./options.ts";
import { ANY_PORT, type RoleProcess, roleArgs, spawnRole } from "./spawn-role.ts";
import { PARENT_PID_ENV, stopRequests } from "./stop-requests.ts";
import { quote } from "../codec/index.ts";
import { startTcpFront, type TcpFront } from "./tcp-front.ts";

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

/** How to start this same program again: the compiled binary, or bun with this script. */
function selfCommand(): string[] {
  const main = Bun.main;
  return main.startsWith("/$bunfs") || main.includes("~BUN") ? [process.execPath] : [process.execPath, main];
}

type Child = RoleProcess;

/** A role of this same program as its own process, which stops by itself when this one is gone, however it died. */
function startRole(name: string, args: string[]): Child {
  return spawnRole(name, [...selfCommand(), ...args], { env: { ...process.env, [PARENT_PID_ENV]: String(process.pid) } });
}

/**
 * Starts the gateway where `door` says. The preferred port can be taken between the probe
 * and the gateway's bind (other programs start clusters too): then once more on a port the
 * OS picks, which nothing can take first.
 */
async function startFront(
  door: { listen: string; busy: number | null },
  flags: ClusterFlags,
  extra: string[],
  children: Child[],
): Promise<{ ready: Record<string, unknown>; busy: number | null }> {
  const start = (listen: string) => {
    const gw = startRole("gateway", [
      "--role",
      "gateway",
      "--http-listen",
      listen,
      "--registry-listen",
      flags.registryListen ?? ANY_PORT,
      ...flags.gateway,
      ...extra,
    ]);
    children.push(gw);
    return gw.ready;
  };
  if (flags.httpListen !== null || door.listen === ANY_PORT) return { ready: await start(door.listen), busy: door.busy };
  try {
    return { ready: await start(door.listen), busy: null };
  } catch {
    children.pop();
    return { ready: await start(ANY_PORT), busy: parseAddr(door.listen).port };
  }
}

/**
 * `engine cluster`: a gateway, N prefill and M decode engines, each its own process on
 * loopback, as in production; one demo request; then serve until Ctrl-C. With
 * `--gateways G` (G > 1) there are G gateway replicas, each on ports of its own, behind one
 * front port: a round-robin TCP proxy in this process (tcp-front.ts), as a Service would
 * be; every engine beats to every replica.
 */
// Long by design: the processes it spawns are pushed onto `children` as they start and
// stopAll() in the one catch ends exactly those; split, a failed step would leak them.
export async function runCluster(config: Config, rest: Map<string, string>, opts: { demo?: boolean; wait?: boolean } = {}) {
  const count = (k: string, d: number) => {
    const v = rest.get(k);
    if (v === undefined) return d;
    if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 16) throw new ConfigError(`--${k}: want 1..16, got ${quote(v)}`);
    return Number(v);
  };
  const nP = count("prefill", 1);
  const nD = count("decode", 2);
  const nG = count("gateways", 1);
  for (const k of rest.keys()) if (!["prefill", "decode", "gateways", "plaintext"].includes(k)) throw new ConfigError(`unknown option --${k}`);
  const plaintext = rest.get("plaintext") === "true";
  // Every option is passed on to the processes it concerns or refused here, before anything starts.
  const flags = clusterFlags(config);
  if (nG > 1 && flags.registryListen !== null) {
    throw new ConfigError("--registry-listen: with --gateways above 1 each replica's registry takes a port of its own");
  }
  // The API keys reach every child (the option through clusterFlags, TL_API_KEY through the environment); the demo sends the first.
  const apiKeys = config.engine.api_key;
  const auth: Record<string, string> =
    apiKeys.length > 0 || process.env.TL_API_KEY ? { authorization: `Bearer ${apiKeys[0] ?? process.env.TL_API_KEY!.split(",")[0]!.trim()}` } : {};
  const wait = opts.wait ?? true;
  // Asked for from the start: a signal, or the parent (npm, a shell, a supervisor) dying, during start-up stops it too.
  const stopped = wait ? stopRequests(process.ppid) : null;
  const door = await frontDoor(flags.httpListen);
  const pki = plaintext ? null : await ephemeralPki(nP, nD, nG);
  const tlsArgs = (id: string) =>
    pki === null
      ? []
      : ["--tls-cert", certFiles(pki, { workerId: id }).cert, "--tls-key", certFiles(pki, { workerId: id }).key, "--tls-ca", join(pki, "ca.crt")];
  const children: Child[] = [];
  let front: TcpFront | null = null;
  let up = false;
  const stopAll = async () => {
    await front?.close();
    for (const c of children) c.proc.kill("SIGTERM");
    await Promise.all(children.map((c) => Promise.race([c.proc.exited, Bun.sleep(15_000).then(() => c.proc.kill("SIGKILL"))])));
    if (pki !== null) rmSync(pki, { recursive: true, force: true });
  };
  void stopped?.then(async () => {
    if (up) return;
    await stopAll();
    process.exit(1);
  });
  try {
    // The cluster shows the prefill → decode hand-off: every request crosses it unless the user sets a threshold.
    const gatewayArgs = (i: number) => [
      ...(config.given.has("gateway.disagg_min_uncached_tokens") ? [] : ["--disagg-min-uncached-tokens", "0"]),
      "--routing-headers",
      ...tlsArgs(`gateway-${i}`),
    ];
    let gwReady: Record<string, unknown>;
    let busy: number | null;
    const replicas: Record<string, unknown>[] = [];
    if (nG === 1) {
      ({ ready: gwReady, busy } = await startFront(door, flags, gatewayArgs(0), children));
      replicas.push(gwReady);
    } else {
      // Each replica on loopback ports of its own; the front port round-robins over them.
      for (let i = 0; i < nG; i++) {
        const gw = startRole(`gateway-${i}`, [
          "--role",
          "gateway",
          "--http-listen",
          "127.0.0.1:0",
          "--registry-listen",
          ANY_PORT,
          ...flags.gateway,
          ...gatewayArgs(i),
        ]);
        children.push(gw);
      }
      replicas.push(...(await Promise.all(children.map((c) => c.ready))));
      const backends = replicas.map((r) => String(r.http));
      const asked = parseAddr(door.listen === ANY_PORT ? "127.0.0.1:0" : door.listen);
      busy = door.busy;
      try {
        front = await startTcpFront(asked.host, asked.port, backends);
      } catch (e) {
        // Taken between the probe and the bind: a port the OS picks, unless the user named this one.
        if (flags.httpListen !== null) throw e;
        front = await startTcpFront("127.0.0.1", 0, backends);
        busy = asked.port;
      }
      gwReady = { ...replicas[0]!, http: front.address };
    }
    const note = busy === null ? null : busyNote(busy, String(gwReady.http));
    if (note) log.warn(note);
    const http = parseAddr(String(gwReady.http));
    const reg = parseAddr(String(gwReady.registry));
    const loopback = (h: string) => (h === "0.0.0.0" ? "127.0.0.1" : h);
    const registries = replicas.map((r) => parseAddr(String(r.registry))).map((a) => `${loopback(a.host)}:${a.port}`);
    // Engines bind ports the OS picks and say which in their ready lines and heartbeats; each beats to every replica.
    const engineArgs = (role: "prefill" | "decode", i: number) =>
      roleArgs(role, ["--worker-id", `${role}-${i}`, "--gateway-registry", registries.join(","), ...flags.engines, ...tlsArgs(`${role}-${i}`)]);
    for (let i = 0; i < nP; i++) children.push(startRole(`prefill-${i}`, engineArgs("prefill", i)));
    for (let i = 0; i < nD; i++) children.push(startRole(`decode-${i}`, engineArgs("decode", i)));
    const ready = await Promise.all(children.map((c) => c.ready));
    const httpPort = http.port;
    const regPort = reg.port;
    const base = `http://${loopback(http.host)}:${httpPort}`;
    // Ready lines say the servers are up; the registry listing them says routing can begin.
    const deadline = Date.now() + 30_000;
    for (const r of replicas) {
      const at = `http://${String(r.http)}`;
      for (;;) {
        const h = (await (await fetch(`${at}/health`, { headers: auth })).json()) as { workers: { prefill: number; decode: number } };
        if (h.workers.prefill === nP && h.workers.decode === nD) break;
        if (Date.now() > deadline) throw new Error(`registry lists ${JSON.stringify(h.workers)}, want ${nP} prefill and ${nD} decode`);
        await Bun.sleep(50);
      }
    }
    const print = (s: string) => process.stdout.write(s + "\n");
    const synthetic = ready[0]!.model === SYNTHETIC_MODEL_NAME;
    print(`tl-engine cluster is up (model ${String(ready[0]!.model)}${synthetic ? "; its random weights make meaningless text" : ""})`);
    print(
      pki === null ? "internal ports: plaintext (--plaintext)" : `internal ports: mutual TLS, an ephemeral CA and certificates in ${pki} (removed on exit)`,
    );
    if (front !== null) print(`  front    ${front.address}: round-robin over ${nG} gateway replicas (a TCP proxy, as a Service would be)`);
    for (const r of ready)
      print(
        `  ${String(r.role).padEnd(8)} ${String(r.worker_id ?? r.gateway_id ?? "gateway").padEnd(10)} pid ${String(r.pid).padEnd(8)} http ${String(r.http)}${r.grpc ? `  grpc ${String(r.grpc)}` : ""}${r.kv ? `  kv ${String(r.kv)}` : ""}${r.registry ? `  registry ${String(r.registry)}` : ""}`,
      );
    if (note) print(`  (${note})`);
    print("");
    print("try:");
    const authFlag = auth.authorization ? ` -H 'authorization: ${auth.authorization}'` : "";
    print(`  curl -N ${base}/v1/chat/completions -H 'content-type: application/json'${authFlag} \\`);
    print(`    -d '{"messages":[{"role":"user","content":"In the beginning God created the heaven and the earth."}],"max_tokens":32,"stream":true}'`);
    print(`  curl ${base}/metrics`);
    // Any engine also serves a request whole when no hand-off header comes with it.
    const colocatedHttp = ready.find((r) => r.role === "decode")?.http;
    const beatMs = config.gateway.heartbeat_interval_ms;
    if (opts.demo ?? true) await demo(base, colocatedHttp === undefined ? undefined : String(colocatedHttp), print, auth, nG > 1 ? beatMs : 0);
    up = true;
    if (stopped) {
      print("\nserving; Ctrl-C stops every process");
      log.info("stopping", { signal: await stopped });
      print("stopping...");
      await stopAll();
    }
    return { base, httpPort, regPort, stop: stopAll, children };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

/** A CA and one certificate per process, in a fresh 0700 temp directory (keys 0600), for this run only. */
async function ephemeralPki(nP: number, nD: number, nG: number): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "tl-cluster-pki-"));
  writeCerts(dir, await mintCluster({ gateway: nG, prefill: nP, decode: nD }));
  return dir;
}

/** The demo request: seeded sampling, so the colocated run must give the same words. */
const DEMO_REQUEST = {
  prompt: "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel,",
  max_tokens: 40,
  stream: true,
  seed: 7,
  temperature: 0.8,
};

/**
 * One request through the gateway (prefill on P, KV pushed to D, decode on D), the same request
 * again (its prompt blocks now cached on D), and once more on a single engine with no hand-off.
 * With several replicas (`beatMs` > 0) the second request reaches another replica, which
 * learns where the prompt's blocks are from the decode engines' next beat: it waits for one.
 */
async function demo(base: string, colocatedHttp: string | undefined, print: (s: string) => void, auth: Record<string, string>, beatMs = 0) {
  print(`\ndemo: one prompt, sampled (seed ${DEMO_REQUEST.seed}, temperature ${DEMO_REQUEST.temperature}, ${DEMO_REQUEST.max_tokens} tokens)`);
  const disagg = await streamCompletion(base, auth);
  if (typeof disagg === "string") return print(`  demo failed: ${disagg}`);
  const h = disagg.headers;
  // Which replica served it, when there are several.
  const by = (hs: Headers) => (beatMs > 0 ? ` by ${hs.get("x-tl-gateway")}` : "");
  print(
    `  ${h.get("x-tl-served")}${by(h)}: prefill on ${h.get("x-tl-prefill-worker")}, decode on ${h.get("x-tl-decode-worker")}, KV blocks sent ${h.get("x-tl-blocks-sent")}`,
  );
  print(`    > ${JSON.stringify(DEMO_REQUEST.prompt + disagg.text)}`);
  if (beatMs > 0) await Bun.sleep(beatMs + 200);
  const again = await streamCompletion(base, auth);
  if (typeof again !== "string") {
    const a = again.headers;
    print(
      `  again${by(a)}: decode on ${a.get("x-tl-decode-worker")}, KV blocks sent ${a.get("x-tl-blocks-sent")}, deduped ${a.get("x-tl-blocks-deduped")} (already there)`,
    );
  }
  if (colocatedHttp === undefined) return;
  const local = await streamCompletion(`http://${colocatedHttp}`, auth);
  if (typeof local === "string") return print(`  colocated run failed: ${local}`);
  print(`  colocated on one engine (${colocatedHttp}), no KV hand-off:`);
  print(`    > ${JSON.stringify(DEMO_REQUEST.prompt + local.text)}`);
  print(`  same text: ${local.text === disagg.text ? "yes" : "NO"}`);
  log.debug("demo done");
}

/** The demo request streamed from `base`: its text and headers, or why it failed. */
async function streamCompletion(base: string, auth: Record<string, string>): Promise<{ text: string; headers: Headers } | string> {
  const headers = { "content-type": "application/json", ...auth };
  // A connection per request: behind the front port, each may reach another replica.
  const res = await fetch(`${base}/v1/completions`, { method: "POST", headers, body: JSON.stringify(DEMO_REQUEST), keepalive: false });
  if (res.status !== 200) return `${res.status} ${await res.text()}`;
  let text = "";
  for await (const data of sseData(res.body!)) {
    if (data === "[DONE]") break;
    const obj = JSON.parse(data) as { choices?: { text?: string }[] };
    text += obj.choices?.[0]?.text ?? "";
  }
  return { text, headers: res.headers };
}
