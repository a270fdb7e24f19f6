import { type PeerCheck, serveGrpc } from "../../rpc/index.ts";
import { KvTransfer } from "../../gen/tl/kv/v1/kv_pb.ts";
import { serveDataPlane, type DataPlaneServer } from "./data-plane-server.ts";
import type { KvReceiver } from "./kv-receiver.ts";
import type { TlsSource } from "../../rpc/tls-config.ts";
import { kvMessageLimit, kvService } from "./kv-service.ts";

export interface ServeKvOptions {
  /** default 127.0.0.1 */
  host?: string;
  /** KvTransfer (gRPC) port; 0 (default): the OS picks */
  port?: number;
  /** Start the binary data plane beside gRPC and advertise it (default true). */
  dataPlane?: boolean;
  /** its port; 0 (default): the OS picks */
  dataPlanePort?: number;
  /** Advertise this host:port instead of the data plane's own (a proxy or NAT in front of it). */
  advertiseDataPlane?: string;
  /** Mutual TLS on both ports; callers checked by role (src/rpc). */
  tls?: TlsSource | null;
  /** The data plane's connection cap and idle timeout. */
  dataPlaneMaxConnections?: number;
  dataPlaneIdleTimeoutMs?: number;
  /** Who may call KvTransfer's methods (PeerCheck, rpc/peer-gate.ts); every caller when omitted. */
  peerCheck?: PeerCheck;
}

export interface KvServer {
  /** host:port of KvTransfer (gRPC) */
  readonly address: string;
  readonly port: number;
  /** host:port the data plane listens on; "" without one */
  readonly dataPlaneAddress: string;
  /** Stops both listeners and ends live connections (their open pushes are freed). */
  close(): Promise<void>;
}

/** Serves tl.kv.v1 KvTransfer over `receiver`, and the binary data plane beside it. */
export async function serveKv(receiver: KvReceiver, opts: ServeKvOptions = {}): Promise<KvServer> {
  const host = opts.host ?? "127.0.0.1";
  let dp: DataPlaneServer | undefined;
  const tls = opts.tls ?? null;
  if (opts.dataPlane ?? true) {
    dp = await serveDataPlane(receiver, {
      host,
      port: opts.dataPlanePort ?? 0,
      tls,
      maxConnections: opts.dataPlaneMaxConnections,
      idleTimeoutMs: opts.dataPlaneIdleTimeoutMs,
    });
  }
  const advertised = opts.advertiseDataPlane ?? dp?.address ?? "";
  try {
    const srv = await serveGrpc((r) => r.service(KvTransfer, kvService(receiver, { dataPlaneAddress: advertised })), {
      host,
      port: opts.port ?? 0,
      maxMessageBytes: kvMessageLimit(receiver),
      tls,
      ...(opts.peerCheck ? { peerCheck: opts.peerCheck } : {}),
    });
    return {
      address: srv.address,
      port: srv.port,
      dataPlaneAddress: dp?.address ?? "",
      async close() {
        await Promise.all([srv.close(), dp?.close()]);
      },
    };
  } catch (e) {
    await dp?.close();
    throw e;
  }
}
