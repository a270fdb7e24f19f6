import { GatewayBeats, GrpcRegistry, parseRegistryTargets, type Resolver, type WorkerIdentity } from "../control/index.ts";
import type { Engine } from "../engine/index.ts";
import { log } from "../obs/index.ts";
import type { KvEventLog, KvPool } from "../pool/index.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import type { KvReceiver } from "../transfer/index.ts";
import type { Closers } from "./closers.ts";

/** Most time a KV event waits for a beat to carry it: beats go early, at most this often, while events come. */
const KV_EVENT_FLUSH_MS = 100;

export interface NodeBeatsOptions {
  /** The gateway_registry option: addresses, or dns:host:port. */
  gatewayRegistry: string;
  resolver?: Resolver;
  tls: TlsSource | null;
  intervalMs: number;
  timeoutMs: number;
  identity: WorkerIdentity;
  engine: Engine;
  pool: KvPool;
  receiver: KvReceiver | null;
  kvEvents: KvEventLog | null;
}

/**
 * An engine's beats to every gateway replica: its load, its KV events (flushed early while
 * they come), a drain a gateway asks for; a replica gone frees the handles it asked for.
 */
export async function startNodeBeats(o: NodeBeatsOptions, closers: Closers): Promise<GatewayBeats> {
  const { engine, pool, kvEvents, identity } = o;
  const beats = await GatewayBeats.start({
    targets: parseRegistryTargets(o.gatewayRegistry),
    dial: (address) => new GrpcRegistry(address, o.timeoutMs, o.tls ?? undefined),
    identity,
    load: () => ({ queueDepth: engine.queueDepth, running: engine.runningCount, freeBlocks: pool.total - pool.used, draining: engine.isDraining }),
    intervalMs: o.intervalMs,
    timeoutMs: o.timeoutMs,
    onDrain: () => void engine.drain(0),
    ...(kvEvents ? { events: { log: kvEvents, named: () => pool.namedHashes() } } : {}),
    onGatewayGone: (gatewayId) => {
      const n = o.receiver?.releaseOwner(gatewayId) ?? 0;
      log.info("gateway gone", { worker_id: identity.workerId, gateway_id: gatewayId, handles_released: n });
    },
    ...(o.resolver ? { resolver: o.resolver } : {}),
  });
  closers.add(() => beats.stop());
  if (kvEvents) flushEventsEarly(kvEvents, beats, Math.min(KV_EVENT_FLUSH_MS, o.intervalMs / 2), closers);
  return beats;
}

/** New events go out within `flushMs` rather than on the next scheduled beat: a replica that did not route a push learns of its blocks as soon as it can. */
function flushEventsEarly(kvEvents: KvEventLog, beats: GatewayBeats, flushMs: number, closers: Closers): void {
  let flush: ReturnType<typeof setTimeout> | null = null;
  kvEvents.onAppend = () => {
    if (flush !== null) return;
    flush = setTimeout(() => {
      flush = null;
      beats.beatNow();
    }, flushMs);
    flush.unref?.();
  };
  closers.add(async () => {
    kvEvents.onAppend = null;
    if (flush !== null) clearTimeout(flush);
  });
}
