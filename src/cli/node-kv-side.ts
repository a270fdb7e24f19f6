import type { KvPool } from "../pool/index.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import { KvReceiver, serveDataPlane, serveKv, type DataPlaneServer, type KvServer } from "../transfer/index.ts";
import type { Closers } from "./closers.ts";

/** The receiving side of a decode or both engine: what it takes from its caller. */
export interface KvSideOptions {
  pool: KvPool;
  host: string;
  tls: TlsSource | null;
  kvPort?: number;
  kvDataPort?: number;
  /** Start the binary data plane beside KvTransfer (default true). */
  offerDataPlane?: boolean;
  handleTtlS: number;
  pushIdleTimeoutMs: number;
  onHandleExpired?: (handleId: string) => void;
  /** The address peers reach a bound one at (the advertised host, same port). */
  advertised: (address: string) => string;
}

/** The KvReceiver over the pool, its data plane and its KvTransfer server, each added to `closers` as it starts. */
export async function startKvSide(o: KvSideOptions, closers: Closers): Promise<{ receiver: KvReceiver; kv: KvServer }> {
  const receiver = new KvReceiver(o.pool, { ttlMs: o.handleTtlS * 1000, onExpired: o.onHandleExpired, pushIdleTimeoutMs: o.pushIdleTimeoutMs });
  // serveKv would advertise its data plane at the bound host, which peers cannot reach
  // behind 0.0.0.0: start it here and advertise it as the other addresses are.
  let dp: DataPlaneServer | null = null;
  if (o.offerDataPlane ?? true) {
    dp = await serveDataPlane(receiver, { host: o.host, port: o.kvDataPort ?? 0, tls: o.tls });
    closers.add(() => dp!.close());
  }
  const kv = await serveKv(receiver, {
    host: o.host,
    port: o.kvPort ?? 0,
    dataPlane: false,
    tls: o.tls,
    ...(dp ? { advertiseDataPlane: o.advertised(dp.address) } : {}),
  });
  closers.add(
    () => kv.close(),
    async () => receiver.close(),
  );
  return { receiver, kv };
}
