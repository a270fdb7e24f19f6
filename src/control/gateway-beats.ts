import { lookup } from "node:dns/promises";
import { Heartbeat, type HeartbeatExtras, type Registry } from "./heartbeat.ts";
import { KvEventFeed, type KvEventSource } from "./kv-event-feed.ts";
import type { WorkerIdentity, WorkerLoad } from "./worker-status.ts";

/** One entry of `gateway_registry`: an address beaten to as is, or a DNS name re-resolved to all its addresses. */
export type RegistryTarget = { kind: "addr"; address: string } | { kind: "dns"; host: string; port: number };

/** Most gateway addresses an engine beats to at once (a list plus what its names resolve to). */
const MAX_GATEWAYS = 32;

/**
 * `gateway_registry`'s value: a comma-separated list of `host:port` (beaten to as written)
 * and `dns:host:port` (the name re-resolved every beat interval, one beat loop per address
 * it yields: a headless Service's pods). Throws a sentence naming the bad entry.
 */
export function parseRegistryTargets(spec: string): RegistryTarget[] {
  const out: RegistryTarget[] = [];
  for (const raw of spec.split(",")) {
    const entry = raw.trim();
    if (entry === "") continue;
    const dns = entry.startsWith("dns:");
    const hostPort = dns ? entry.slice(4) : entry;
    const colon = hostPort.lastIndexOf(":");
    const host = hostPort.slice(0, colon).replace(/^\[(.*)\]$/, "$1");
    const port = Number(hostPort.slice(colon + 1));
    if (colon <= 0 || host === "" || !(Number.isInteger(port) && port >= 1 && port <= 65535)) {
      throw new Error(`gateway_registry: ${JSON.stringify(entry)} is not host:port or dns:host:port`);
    }
    out.push(dns ? { kind: "dns", host, port } : { kind: "addr", address: hostPort });
  }
  if (out.length > MAX_GATEWAYS) throw new Error(`gateway_registry: ${out.length} entries, max ${MAX_GATEWAYS}`);
  return out;
}

/** All addresses of a name (A and AAAA); injectable so tests move replicas in and out. */
export type Resolver = (host: string) => Promise<string[]>;

const systemResolver: Resolver = async (host) => (await lookup(host, { all: true })).map((a) => a.address);

export interface GatewayBeatsOptions {
  targets: readonly RegistryTarget[];
  /** A WorkerRegistry client for one address. */
  dial: (address: string) => Registry & { close?: () => void };
  identity: WorkerIdentity;
  load: () => WorkerLoad;
  intervalMs: number;
  timeoutMs: number;
  onDrain?: () => void;
  /** The engine's KV events (engines that receive KV); each gateway gets its own cursor. */
  events?: KvEventSource;
  /** A gateway replica is gone (see HeartbeatExtras.onGatewayGone). */
  onGatewayGone?: (gatewayId: string) => void;
  resolver?: Resolver;
}

/**
 * An engine's beats to every gateway replica: one Heartbeat loop per address, each with
 * its own KV event cursor (every replica keeps its own registry and index). DNS names are
 * re-resolved every interval: a new address gets a loop (starting with a snapshot), an
 * address gone has its loop retired, which counts that replica as gone. A failed lookup
 * keeps the addresses it last gave.
 */
export class GatewayBeats {
  private readonly loops = new Map<string, Heartbeat>();
  private readonly clients = new Map<string, { close?: () => void }>();
  private readonly resolved = new Map<string, string[]>();
  private readonly timer: ReturnType<typeof setInterval> | null;
  private stopped = false;
  private refreshing: Promise<void> = Promise.resolve();

  private constructor(private readonly opts: GatewayBeatsOptions) {
    const hasDns = opts.targets.some((t) => t.kind === "dns");
    this.timer = hasDns ? setInterval(() => void this.refresh(), opts.intervalMs) : null;
    this.timer?.unref?.();
  }

  /** Starts the loops of every fixed address and of every address the names resolve to now. */
  static async start(opts: GatewayBeatsOptions): Promise<GatewayBeats> {
    const beats = new GatewayBeats(opts);
    await beats.refresh();
    return beats;
  }

  /** The addresses beaten to now. */
  get addresses(): string[] {
    return [...this.loops.keys()].sort();
  }

  /** Consecutive failures of the worst loop (metrics). */
  get failures(): number {
    let n = 0;
    for (const hb of this.loops.values()) n = Math.max(n, hb.state.failures);
    return n;
  }

  /** Every loop sends its next beat now. */
  beatNow(): void {
    for (const hb of this.loops.values()) hb.beatNow();
  }

  /** Resolves the names again and starts or retires loops to match. */
  refresh(): Promise<void> {
    this.refreshing = this.refreshing.then(() => this.doRefresh());
    return this.refreshing;
  }

  private async doRefresh(): Promise<void> {
    if (this.stopped) return;
    const resolve = this.opts.resolver ?? systemResolver;
    const want = new Set<string>();
    for (const t of this.opts.targets) {
      if (t.kind === "addr") {
        want.add(t.address);
        continue;
      }
      const key = `${t.host}:${t.port}`;
      try {
        this.resolved.set(
          key,
          (await resolve(t.host)).map((a) => (a.includes(":") ? `[${a}]:${t.port}` : `${a}:${t.port}`)),
        );
      } catch {
        // Keep what the name gave last: a DNS hiccup must not retire live replicas.
      }
      for (const a of this.resolved.get(key) ?? []) want.add(a);
    }
    if (this.stopped) return;
    for (const [address, hb] of this.loops) {
      if (want.has(address)) continue;
      this.loops.delete(address);
      await hb.retire();
      this.clients.get(address)?.close?.();
      this.clients.delete(address);
    }
    for (const address of want) {
      if (this.loops.has(address) || this.loops.size >= MAX_GATEWAYS) continue;
      const client = this.opts.dial(address);
      const extras: HeartbeatExtras = {
        ...(this.opts.events ? { events: new KvEventFeed(this.opts.events) } : {}),
        ...(this.opts.onGatewayGone ? { onGatewayGone: this.opts.onGatewayGone } : {}),
      };
      this.clients.set(address, client);
      this.loops.set(
        address,
        Heartbeat.spawn(client, this.opts.identity, this.opts.load, this.opts.intervalMs, this.opts.timeoutMs, this.opts.onDrain, extras),
      );
    }
  }

  /** Stops every loop (the engine is stopping: its handles go with it, so nobody is told a replica is gone). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.refreshing;
    await Promise.all([...this.loops.values()].map((hb) => hb.stop()));
    for (const c of this.clients.values()) c.close?.();
    this.loops.clear();
    this.clients.clear();
  }
}
