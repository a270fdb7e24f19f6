import type { ConnectError } from "@connectrpc/connect";
import { promptHashes } from "../codec/index.ts";
import { Role } from "../gen/tl/control/v1/control_pb.ts";
import { failedSideOf } from "../handoff/index.ts";
import { Code } from "../rpc/status.ts";
import { type KvAffinity, type Pick, pickByLoad, pickDecode } from "./router.ts";
import type { WorkerRegistry } from "./worker-registry.ts";

/** Work this gateway sent each worker and has not seen finish, added to what the worker last reported. */
export class InFlight {
  readonly byWorker = new Map<string, number>();

  add(workerId: string, d: number): void {
    this.byWorker.set(workerId, (this.byWorker.get(workerId) ?? 0) + d);
  }
}

/** A prefill engine and the decode engine its push goes to. */
export interface Pair {
  prefill: Pick;
  decode: Pick;
}

/** Picks among the live workers: P by load, D by cached prefix then load; a `both` engine when there is no pair. */
export class PairPicker {
  constructor(
    private readonly registry: WorkerRegistry,
    private readonly affinity: KvAffinity,
    private readonly inflight: InFlight,
  ) {}

  pair(promptTokens: readonly number[], exclude: ReadonlySet<string>): Pair | null {
    const workers = this.registry.live();
    const prefill = pickByLoad(workers, Role.PREFILL, this.inflight.byWorker, exclude);
    if (!prefill) return null;
    const hashes = promptHashes(promptTokens, prefill.worker.status.blockTokens);
    const decode = pickDecode(workers, hashes, this.affinity, this.inflight.byWorker, exclude);
    return decode ? { prefill, decode } : null;
  }

  colocated(exclude: ReadonlySet<string>): Pick | null {
    return pickByLoad(this.registry.live(), Role.BOTH, this.inflight.byWorker, exclude);
  }
}

const RETRYABLE = new Set([Code.DataLoss, Code.Unavailable, Code.DeadlineExceeded]);

/** What to do after a failed Prefill: route again without `exclude`, or give up. */
export type RetryDecision = { again: true; exclude: string; why: string } | { again: false };

/**
 * One request's retry policy over pairs. Corruption, an unreachable engine or a
 * deadline is retried once on another pair, without the engine that failed (the side
 * P names in its error); a decode engine with no room, or a worker refusing the
 * request outright, routes elsewhere; anything else is the client's answer.
 */
export class RetryPolicy {
  /** Attempts at most, a pair each (the loop ends sooner when no pair is left). */
  static readonly MAX_ATTEMPTS = 4;
  private retried = false;

  /** Whether the request was served after a retry. */
  get wasRetried(): boolean {
    return this.retried;
  }

  decide(err: ConnectError, prefillId: string, decodeId: string): RetryDecision {
    const blame = failedSideOf(err.metadata) === "decode" ? decodeId : prefillId;
    if (RETRYABLE.has(err.code) && !this.retried) {
      this.retried = true;
      return { again: true, exclude: blame, why: "prefill failed; retrying on another pair" };
    }
    // A decode engine out of blocks is a fact about that engine: another may have room.
    if (err.code === Code.ResourceExhausted && blame === decodeId) {
      this.retried = true;
      return { again: true, exclude: decodeId, why: "decode engine has no room; routing elsewhere" };
    }
    if (err.code === Code.FailedPrecondition) return { again: true, exclude: blame, why: "worker refused the request; routing elsewhere" };
    return { again: false };
  }
}
