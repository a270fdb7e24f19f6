// Decode and prefill sides wired for the transfer tests, over either path.
import type { KvShape } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { KV_FORMAT } from "../../src/codec/index.ts";
import {
  DataPlaneClient,
  KvReceiver,
  RoutingTransport,
  serveKv,
  type KvChunkLike,
  type KvReceiverOptions,
  type KvServer,
  type PushOptions,
  type PushRoute,
} from "../../src/transfer/index.ts";

export type Path = "grpc" | "data-plane";
export const PATHS: Path[] = ["grpc", "data-plane"];

/** kv-block.md's transfer arithmetic example: P = 128, one-block envelope 172 bytes. */
export const SHAPE: KvShape = { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 };
export const ENVELOPE_BYTES = 172;

export interface Decode {
  pool: KvPool;
  rx: KvReceiver;
  server: KvServer;
  /** host:port P dials */
  target: string;
  close(): Promise<void>;
}

export async function startDecode(
  path: Path,
  opts: { blocks?: number; shape?: KvShape; rx?: Partial<KvReceiverOptions>; advertiseDataPlane?: string } = {},
): Promise<Decode> {
  const pool = new KvPool(opts.shape ?? SHAPE, opts.blocks ?? 64);
  const rx = new KvReceiver(pool, { ttlMs: 60_000, pushIdleTimeoutMs: 10_000, ...opts.rx });
  const server = await serveKv(rx, {
    dataPlane: path === "data-plane",
    ...(opts.advertiseDataPlane !== undefined ? { advertiseDataPlane: opts.advertiseDataPlane } : {}),
  });
  return {
    pool,
    rx,
    server,
    target: server.address,
    async close() {
      await server.close();
      rx.close();
    },
  };
}

export function prefillTransport(path: Path, timeoutMs = 10_000): RoutingTransport {
  return new RoutingTransport({ timeoutMs, dataPlane: path === "data-plane" ? new DataPlaneClient({ timeoutMs }) : false });
}

/** The route `t` takes to `target` (a HasBlocks of nothing). */
export async function routeTo(t: RoutingTransport, target: string): Promise<PushRoute> {
  return (await t.hasBlocks(target, [], KV_FORMAT)).route;
}

/** The data plane address a push to `target` dials, or undefined when it goes over gRPC. */
export async function dataPlaneOf(t: RoutingTransport, target: string): Promise<string | undefined> {
  const route = await routeTo(t, target);
  return route.via === "data-plane" ? route.address : undefined;
}

/** One push to `target` along the route its HasBlocks answer names. */
export async function pushTo(t: RoutingTransport, target: string, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts?: PushOptions) {
  return t.push(await routeTo(t, target), chunks, opts);
}

export interface Snapshot {
  used: number;
  cached: number;
  free: number;
  pending: number;
  inFlight: number;
}

export function snapshot(pool: KvPool, rx?: KvReceiver): Snapshot {
  return { used: pool.used, cached: pool.cached, free: pool.free, pending: rx?.pending() ?? 0, inFlight: rx?.inFlight() ?? 0 };
}

/** Waits (bounded) for the server side to settle a broken stream; returns whether it did. */
export async function settle(cond: () => boolean, maxMs = 5_000): Promise<boolean> {
  const end = Date.now() + maxMs;
  while (!cond()) {
    if (Date.now() > end) return false;
    await Bun.sleep(5);
  }
  return true;
}

/** Turns every cached block of `pool` into a free one (an eviction storm on D). */
export function evictAll(pool: KvPool): void {
  const ids = pool.allocate(pool.free + pool.cached);
  if (ids !== null) pool.releaseAll(ids);
}
