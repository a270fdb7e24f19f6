import type { Client } from "@connectrpc/connect";
import { WorkerRegistry, type HeartbeatAck, type WorkerEntry, type WorkerStatus } from "../gen/tl/control/v1/control_pb.ts";
import { grpcClient } from "../rpc/index.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import type { Registry } from "./heartbeat.ts";

/** The gateway's WorkerRegistry over gRPC at `target` ("host:port"). */
export class GrpcRegistry implements Registry {
  private readonly client: Client<typeof WorkerRegistry>;

  constructor(
    readonly target: string,
    timeoutMs: number,
    tls?: TlsSource,
  ) {
    // Beats go only to a server whose certificate names the gateway.
    this.client = grpcClient(WorkerRegistry, target, { timeoutMs, ...(tls ? { tls: { source: tls, expect: ["gateway"] } } : {}) });
  }

  heartbeat(status: WorkerStatus, timeoutMs: number, signal?: AbortSignal): Promise<HeartbeatAck> {
    return this.client.heartbeat(status, { timeoutMs, signal });
  }

  async listWorkers(): Promise<WorkerEntry[]> {
    return (await this.client.listWorkers({})).workers;
  }
}
