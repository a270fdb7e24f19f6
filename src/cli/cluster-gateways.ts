import type { ClusterFlags } from "./cluster-flags.ts";
import type { ClusterProcesses } from "./cluster-processes.ts";
import { parseAddr } from "./options.ts";
import { ANY_PORT } from "./spawn-role.ts";
import { startTcpFront } from "./tcp-front.ts";

type Ready = Record<string, unknown>;

/**
 * The cluster's gateways where `door` says: one gateway on the front port, or `n` replicas
 * on loopback ports of their own behind a round-robin TCP front there. `front` is the
 * ready line clients use (the front's address with several), `busy` the preferred port that
 * was taken, if one was.
 */
export async function startGateways(
  n: number,
  door: { listen: string; busy: number | null },
  flags: ClusterFlags,
  args: (i: number) => string[],
  procs: ClusterProcesses,
): Promise<{ front: Ready; replicas: Ready[]; busy: number | null }> {
  if (n === 1) {
    const { ready, busy } = await startFront(door, flags, args(0), procs);
    return { front: ready, replicas: [ready], busy };
  }
  const starting = Array.from({ length: n }, (_, i) =>
    procs.start(`gateway-${i}`, ["--role", "gateway", "--http-listen", "127.0.0.1:0", "--registry-listen", ANY_PORT, ...flags.gateway, ...args(i)]),
  );
  const replicas = await Promise.all(starting.map((c) => c.ready));
  const backends = replicas.map((r) => String(r.http));
  const asked = parseAddr(door.listen === ANY_PORT ? "127.0.0.1:0" : door.listen);
  let busy = door.busy;
  try {
    procs.front = await startTcpFront(asked.host, asked.port, backends);
  } catch (e) {
    // Taken between the probe and the bind: a port the OS picks, unless the user named this one.
    if (flags.httpListen !== null) throw e;
    procs.front = await startTcpFront("127.0.0.1", 0, backends);
    busy = asked.port;
  }
  return { front: { ...replicas[0]!, http: procs.front.address }, replicas, busy };
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
  procs: ClusterProcesses,
): Promise<{ ready: Ready; busy: number | null }> {
  const start = (listen: string) =>
    procs.start("gateway", ["--role", "gateway", "--http-listen", listen, "--registry-listen", flags.registryListen ?? ANY_PORT, ...flags.gateway, ...extra])
      .ready;
  if (flags.httpListen !== null || door.listen === ANY_PORT) return { ready: await start(door.listen), busy: door.busy };
  try {
    return { ready: await start(door.listen), busy: null };
  } catch {
    procs.dropLast();
    return { ready: await start(ANY_PORT), busy: parseAddr(door.listen).port };
  }
}
