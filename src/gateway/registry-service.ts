import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import {
  HeartbeatAckSchema,
  ListWorkersResponseSchema,
  Role,
  WorkerEntrySchema,
  WorkerRegistry as WorkerRegistryService,
  type KvEvents,
  type WorkerStatus,
} from "../gen/tl/control/v1/control_pb.ts";
import { KV_FORMAT, quote } from "../codec/index.ts";
import type { EventsAnswer, PrefixIndex } from "./prefix-index.ts";
import type { WorkerRegistry } from "./worker-registry.ts";
import { callerOf, type Caller } from "../rpc/peer-gate.ts";
import { refusal } from "../rpc/peer-policy.ts";

export interface RegistryServiceOptions {
  /** How often dead workers are forgotten; the registry's interval by default. */
  sweepEveryMs?: number;
  /** Most workers held; a beat from a new one beyond it is refused (max_workers). */
  maxWorkers: number;
  /** The gateway's own model and tokenizer: beats from engines that differ are refused. */
  expect?: ExpectedModel;
  /** Where engines' KV events go; without it the events are acknowledged and dropped. */
  index?: PrefixIndex;
  /** This replica's identity, told to engines in every ack (HeartbeatAck.gateway_id). */
  gatewayId?: string;
  /** Told of every beat's events once applied, and of the answer (metrics). */
  onKvEvents?: (events: KvEvents, answer: EventsAnswer) => void;
}

/** Most hashes one beat's KV events may carry; the engine sends at most this many (MAX_EVENT_HASHES_PER_BEAT). */
const MAX_EVENT_HASHES = 4096;

/** What every engine must match for the gateway's prompt-block hashes to be theirs. */
export interface ExpectedModel {
  model: string;
  vocabSize: number;
  tokenizerFingerprint: string;
}

/**
 * Largest heartbeat accepted on the registry port: a WorkerStatus is a few hundred bytes, its
 * KV events at most MAX_EVENT_HASHES fixed64 (32 KiB) plus one tag per KvEvent.
 */
export const MAX_HEARTBEAT_BYTES = 96 * 1024;

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
    opts: RegistryServiceOptions,
  ) {
    const maxWorkers = opts.maxWorkers;
    this.impl = {
      heartbeat: (status, ctx) => {
        validate(status);
        checkCaller(status, callerOf(ctx));
        const known = registry.list().some((w) => w.status.workerId === status.workerId);
        if (!known && registry.list().length >= maxWorkers) {
          throw new ConnectError(`heartbeat: the registry holds its maximum of ${maxWorkers} workers`, Code.ResourceExhausted);
        }
        if (opts.expect) sameModel(status, opts.expect);
        const ack = create(HeartbeatAckSchema, { ...registry.beat(status), gatewayId: opts.gatewayId ?? "" });
        if (status.kvEvents !== undefined && opts.index !== undefined) {
          const answer = opts.index.apply(status.workerId, status.kvEvents);
          ack.kvNextSeq = answer.nextSeq;
          ack.kvSnapshot = answer.snapshot;
          opts.onKvEvents?.(status.kvEvents, answer);
        }
        return ack;
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
    this.sweeper = setInterval(() => {
      for (const id of registry.sweep()) opts.index?.forget(id);
    }, opts.sweepEveryMs ?? registry.intervalMs);
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

const CERT_ROLE: Partial<Record<Role, string>> = { [Role.PREFILL]: "prefill", [Role.DECODE]: "decode", [Role.BOTH]: "both" };

/**
 * On an mTLS port the beat must come from the worker it describes, playing the role its
 * certificate names: a prefill certificate cannot register a decode worker (and so be
 * sent users' prompts and handles). The method table has already checked it is an engine.
 */
function checkCaller(status: WorkerStatus, caller: Caller): void {
  if (caller === undefined) return;
  const why = refusal("tl.control.v1.WorkerRegistry/Heartbeat", caller, status.workerId);
  if (why !== null) throw new ConnectError(why.message, why.unauthenticated ? Code.Unauthenticated : Code.PermissionDenied);
  if (CERT_ROLE[status.role] !== caller.role) {
    throw new ConnectError(`heartbeat from ${status.workerId}: role ${Role[status.role]} differs from its certificate's ${caller.role}`, Code.PermissionDenied);
  }
}

function validate(status: WorkerStatus): void {
  if (status.workerId === "") {
    throw new ConnectError("heartbeat: empty worker_id", Code.InvalidArgument);
  }
  if (status.kvFormat !== KV_FORMAT) {
    throw new ConnectError(`heartbeat from ${status.workerId}: kv_format ${status.kvFormat}, want ${KV_FORMAT}`, Code.FailedPrecondition);
  }
  if (status.role === Role.UNSPECIFIED || Role[status.role] === undefined) {
    throw new ConnectError(`heartbeat from ${status.workerId}: role ${status.role} is not prefill, decode or both`, Code.InvalidArgument);
  }
  if (status.kvEvents !== undefined) {
    let n = 0;
    for (const e of status.kvEvents.events) n += e.hashes.length;
    if (n > MAX_EVENT_HASHES) {
      throw new ConnectError(`heartbeat from ${status.workerId}: ${n} KV event hashes, max ${MAX_EVENT_HASHES} per beat`, Code.InvalidArgument);
    }
  }
}

/**
 * An engine whose model name, vocabulary or tokenizer differs from the gateway's would be
 * routed by hashes of token ids it does not produce: refused, by value. Engines that report no
 * vocab_size or fingerprint (older ones) are checked on what they do report.
 */
function sameModel(status: WorkerStatus, want: ExpectedModel): void {
  const diff: string[] = [];
  if (status.model !== want.model) diff.push(`model ${quote(status.model)}, want ${quote(want.model)}`);
  if (status.vocabSize !== 0 && status.vocabSize !== want.vocabSize) diff.push(`vocab_size ${status.vocabSize}, want ${want.vocabSize}`);
  if (status.tokenizerFingerprint !== "" && status.tokenizerFingerprint !== want.tokenizerFingerprint) {
    diff.push(`tokenizer fingerprint ${status.tokenizerFingerprint}, want ${want.tokenizerFingerprint}`);
  }
  if (diff.length > 0) {
    throw new ConnectError(
      `heartbeat from ${status.workerId}: ${diff.join("; ")} (the gateway tokenizes for another model: its prompt hashes would not match)`,
      Code.FailedPrecondition,
    );
  }
}
