import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import {
  HeartbeatAckSchema,
  ListWorkersResponseSchema,
  Role,
  WorkerEntrySchema,
  WorkerRegistry as WorkerRegistryService,
  type WorkerStatus,
} from "../gen/tl/control/v1/control_pb.ts";
import { KV_FORMAT } from "../codec/index.ts";
import type { WorkerRegistry } from "./worker-registry.ts";

export interface RegistryServiceOptions {
  /** How often dead workers are forgotten; the registry's interval by default. */
  sweepEveryMs?: number;
}

/**
 * tl.control.v1.WorkerRegistry over a WorkerRegistry. Mount with
 * `serveGrpc(svc.routes)` (or call `svc.routes(router)` among other services);
 * close() stops the sweep timer.
 */
export class RegistryService {
  readonly impl: ServiceImpl<typeof WorkerRegistryService>;
  private readonly sweeper: ReturnType<typeof setInterval>;

  constructor(
    readonly registry: WorkerRegistry,
    opts: RegistryServiceOptions = {},
  ) {
    this.impl = {
      heartbeat: (status) => {
        validate(status);
        return create(HeartbeatAckSchema, registry.beat(status));
      },
      listWorkers: () =>
        create(ListWorkersResponseSchema, {
          workers: registry.list().map((w) =>
            create(WorkerEntrySchema, {
              status: w.status,
              lastSeenUnixMs: BigInt(w.lastSeenUnixMs),
              missed: w.missed,
            }),
          ),
        }),
    };
    this.sweeper = setInterval(() => registry.sweep(), opts.sweepEveryMs ?? registry.intervalMs);
    // Forgetting the dead is housekeeping; it must not keep a process alive.
    this.sweeper.unref?.();
  }

  readonly routes = (router: ConnectRouter): void => {
    router.service(WorkerRegistryService, this.impl);
  };

  close(): void {
    clearInterval(this.sweeper);
  }
}

function validate(status: WorkerStatus): void {
  if (status.workerId === "") {
    throw new ConnectError("heartbeat: empty worker_id", Code.InvalidArgument);
  }
  if (status.kvFormat !== KV_FORMAT) {
    throw new ConnectError(
      `heartbeat from ${status.workerId}: kv_format ${status.kvFormat}, want ${KV_FORMAT}`,
      Code.FailedPrecondition,
    );
  }
  if (status.role === Role.UNSPECIFIED || Role[status.role] === undefined) {
    throw new ConnectError(
      `heartbeat from ${status.workerId}: role ${status.role} is not prefill, decode or both`,
      Code.InvalidArgument,
    );
  }
}
