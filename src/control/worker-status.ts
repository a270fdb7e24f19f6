import { create } from "@bufbuild/protobuf";
import { KV_FORMAT } from "../codec/index.ts";
import { Role, WorkerStatusSchema, type WorkerStatus } from "../gen/tl/control/v1/control_pb.ts";

export type EngineRole = "prefill" | "decode" | "both";

/** What a worker is; fixed for the life of the process. */
export interface WorkerIdentity {
  workerId: string;
  httpAddress: string;
  grpcAddress: string;
  /** KvTransfer host:port; advertised only by roles that receive KV. */
  kvAddress: string;
  role: EngineRole;
  model: string;
  blockTokens: number;
  totalBlocks: number;
  /** The tokenizer's vocabulary size and fingerprint, so a gateway can refuse a tokenizer unlike its own. */
  vocabSize?: number;
  tokenizerFingerprint?: string;
  /** The model's parameter count, stored dtype and resident bytes, for the gateway's /v1/models. */
  modelStats?: { parameters: number; dtype: string; residentBytes: number };
}

/** What a worker is doing; sampled afresh for every beat. */
export interface WorkerLoad {
  queueDepth: number;
  running: number;
  freeBlocks: number;
  draining: boolean;
}

const ROLES: Record<EngineRole, Role> = {
  prefill: Role.PREFILL,
  decode: Role.DECODE,
  both: Role.BOTH,
};

function roleToProto(role: EngineRole): Role {
  return ROLES[role];
}

/** Whether a worker of this role accepts KV pushes (and so is a decode target). */
export function receivesKv(role: EngineRole): boolean {
  return role !== "prefill";
}

export function workerStatus(identity: WorkerIdentity, load: WorkerLoad, seq: bigint): WorkerStatus {
  return create(WorkerStatusSchema, {
    workerId: identity.workerId,
    httpAddress: identity.httpAddress,
    grpcAddress: identity.grpcAddress,
    // A prefill-only engine runs no KvTransfer; an address here would invite pushes nobody serves.
    kvAddress: receivesKv(identity.role) ? identity.kvAddress : "",
    role: roleToProto(identity.role),
    model: identity.model,
    kvFormat: KV_FORMAT,
    queueDepth: load.queueDepth,
    running: load.running,
    freeBlocks: load.freeBlocks,
    totalBlocks: identity.totalBlocks,
    draining: load.draining,
    seq,
    blockTokens: identity.blockTokens,
    vocabSize: identity.vocabSize ?? 0,
    tokenizerFingerprint: identity.tokenizerFingerprint ?? "",
    parameters: BigInt(identity.modelStats?.parameters ?? 0),
    dtype: identity.modelStats?.dtype ?? "",
    residentBytes: BigInt(identity.modelStats?.residentBytes ?? 0),
  });
}
