import { formatIdentity, PEER_ROLES, speaksFor, type PeerIdentity, type PeerRole } from "./peer-identity.ts";
import { quote } from "../codec/index.ts";

/**
 * Which certificate roles may call which internal method. A `both` engine plays
 * prefill and decode (the registry's rule), so wherever prefill may call, both may.
 * The data plane's push is named like a gRPC method so one table covers every port.
 */
export interface MethodRule {
  roles: readonly PeerRole[];
  /** The request's worker id must be the certificate's own (Heartbeat). */
  sameWorker?: boolean;
}

const ENGINES: readonly PeerRole[] = ["prefill", "decode", "both"];
const PUSHERS: readonly PeerRole[] = ["prefill", "both"];

export const DATA_PLANE_PUSH = "tl.kv.v1.DataPlane/Push";

// Looked up by the method a caller names: a null-prototype table, so "__proto__" or
// "constructor" finds nothing (refused as unknown) rather than Object.prototype's members.
export const METHOD_POLICY: Readonly<Record<string, MethodRule>> = Object.assign(Object.create(null) as Record<string, MethodRule>, {
  "tl.control.v1.WorkerRegistry/Heartbeat": { roles: ENGINES, sameWorker: true },
  "tl.control.v1.WorkerRegistry/ListWorkers": { roles: ["gateway", "admin"] },
  "tl.kv.v1.KvTransfer/PushKv": { roles: PUSHERS },
  [DATA_PLANE_PUSH]: { roles: PUSHERS },
  "tl.kv.v1.KvTransfer/HasBlocks": { roles: [...PUSHERS, "gateway"] },
  "tl.kv.v1.KvTransfer/Release": { roles: [...PUSHERS, "gateway"] },
  "tl.engine.v1.EngineControl/Prefill": { roles: ["gateway", "admin"] },
  "tl.engine.v1.EngineControl/Cancel": { roles: ["gateway", "admin"] },
  "tl.engine.v1.EngineControl/Drain": { roles: ["gateway", "admin"] },
  "tl.engine.v1.EngineControl/Info": { roles: PEER_ROLES },
});

/** Roles a `decode_target` (the server a prefill engine pushes to) must present. */
export const DECODE_TARGET_ROLES: readonly PeerRole[] = ["decode", "both"];

/**
 * Why `peer` may not call `method` (a sentence for a PERMISSION_DENIED / UNAUTHENTICATED
 * error), or null when it may. `workerId` is the worker the request speaks for, checked
 * on sameWorker rules (left to the caller when undefined: the id is in a body not yet
 * read). A method missing from the table is refused: new RPCs start closed.
 */
export function refusal(method: string, peer: PeerIdentity | null, workerId?: string): { unauthenticated: boolean; message: string } | null {
  if (peer === null) return { unauthenticated: true, message: `${method}: a cluster certificate is required` };
  const rule = METHOD_POLICY[method];
  if (rule === undefined) return { unauthenticated: false, message: `${method}: not open to any peer` };
  if (!rule.roles.includes(peer.role)) {
    return { unauthenticated: false, message: `${method}: role ${peer.role} may not call it (allowed: ${rule.roles.join(", ")})` };
  }
  if (rule.sameWorker && workerId !== undefined && !speaksFor(peer, workerId)) {
    return { unauthenticated: false, message: `${method}: ${formatIdentity(peer)} may not speak for worker ${quote(workerId ?? "")}` };
  }
  return null;
}

/** Null when `peer` may be pushed to; otherwise why not (a prefill engine's check of its decode_target). */
export function decodeTargetRefusal(target: string, peer: PeerIdentity | null): string | null {
  if (peer === null) return `decode_target ${target} presented no cluster identity`;
  if (!DECODE_TARGET_ROLES.includes(peer.role)) return `decode_target ${target} is ${formatIdentity(peer)}, not a decode engine`;
  return null;
}
