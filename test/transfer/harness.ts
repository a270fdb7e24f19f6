// Decode and prefill sides wired for the transfer tests, over either path.
import type { KvShape } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { DataPlaneClient, GrpcTransport, KvReceiver, serveKv, type KvReceiverOptions, type KvServer } from "../../src/transfer/index.ts";

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
  opts: { blocks?: number; shape?: KvShape; rx?: KvReceiverOptions; advertiseDataPlane?: string } = {},
): Promise<Decode> {
  const pool = new KvPool(opts.shape ?? SHAPE, opts.blocks ?? 64);
  const rx = new KvReceiver(pool, opts.rx);
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

export function prefillTransport(path: Path, timeoutMs = 10_000): GrpcTransport {
  return new GrpcTransport({ timeoutMs, dataPlane: path === "data-plane" ? new DataPlaneClient({ timeoutMs }) : false });
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
