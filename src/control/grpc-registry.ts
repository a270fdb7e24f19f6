import type { Client } from "@connectrpc/connect";
import { WorkerRegistry, type HeartbeatAck, type WorkerEntry, type WorkerStatus } from "../gen/tl/control/v1/control_pb.ts";
import { grpcClient } from "../rpc/index.ts";
import type { Registry } from "./heartbeat.ts";

/** The gateway's WorkerRegistry over gRPC at `target` ("host:port"). */
export class GrpcRegistry implements Registry {
  private readonly client: Client<typeof WorkerRegistry>;

  constructor(
    readonly target: string,
    timeoutMs = 1000,
  ) {
    this.client = grpcClient(WorkerRegistry, target, { timeoutMs });
  }

  heartbeat(status: WorkerStatus, timeoutMs: number, signal?: AbortSignal): Promise<HeartbeatAck> {
    return this.client.heartbeat(status, { timeoutMs, signal });
  }

  async listWorkers(): Promise<WorkerEntry[]> {
    return (await this.client.listWorkers({})).workers;
  }
}
