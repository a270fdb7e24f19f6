import type { ConnectError } from "@connectrpc/connect";
import { promptHashes } from "../codec/index.ts";
import { Role } from "../gen/tl/control/v1/control_pb.ts";
import { FAILED_SIDE_HEADER, failedSideOf } from "../handoff/index.ts";
import { Code } from "../rpc/status.ts";
import { type CostWeights, type DecodePick, type KvAffinity, type Pick, pickByLoad, pickDecode, type Suspects } from "./router.ts";
import type { WorkerRegistry } from "./worker-registry.ts";

/**
 * Requests this gateway routed to each worker and has not seen finish. A request is
 * counted from the moment a worker is chosen for it (reserve) until its release runs,
 * which every outcome must call; a release runs at most once.
 */
export class InFlight {
  readonly byWorker = new Map<string, number>();

  add(workerId: string, d: number): void {
    this.byWorker.set(workerId, (this.byWorker.get(workerId) ?? 0) + d);
  }

  /** Counts one request on `workerId` now; the returned release uncounts it (idempotent). */
  reserve(workerId: string): () => void {
    this.add(workerId, 1);
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.add(workerId, -1);
    };
  }
}

/** A chosen worker with its reservation: `release` runs once the request is done with it. */
export interface Reserved<P extends Pick = Pick> {
  pick: P;
  release: () => void;
}

/** A prefill engine and the decode engine its push goes to, both reserved. */
export interface Pair {
  prefill: Pick;
  decode: DecodePick;
  releasePrefill: () => void;
  releaseDecode: () => void;
}

/**
 * Picks among the live workers, healthy ones first (see Suspects): P by load, D by the
 * cost of CostWeights; a `both` engine when there is no pair. Every pick is reserved
 * in InFlight at once, so the next decision of a burst already sees it.
 */
export class PairPicker {
  constructor(
    private readonly registry: WorkerRegistry,
    private readonly affinity: KvAffinity,
    private readonly inflight: InFlight,
    private readonly weights: CostWeights,
    private readonly suspects?: Suspects,
  ) {}

  pair(promptTokens: readonly number[], exclude: ReadonlySet<string>): Pair | null {
    const workers = this.registry.live();
    const prefill = pickByLoad(workers, Role.PREFILL, this.inflight.byWorker, exclude, this.suspects);
    if (!prefill) return null;
    const hashes = promptHashes(promptTokens, prefill.worker.status.blockTokens);
    const decode = pickDecode(workers, hashes, this.affinity, this.inflight.byWorker, exclude, this.weights, this.suspects);
    if (!decode) return null;
    return {
      prefill,
      decode,
      releasePrefill: this.inflight.reserve(prefill.worker.status.workerId),
      releaseDecode: this.inflight.reserve(decode.worker.status.workerId),
    };
  }

  colocated(exclude: ReadonlySet<string>): Reserved | null {
    const pick = pickByLoad(this.registry.live(), Role.BOTH, this.inflight.byWorker, exclude, this.suspects);
    return pick ? { pick, release: this.inflight.reserve(pick.worker.status.workerId) } : null;
  }
}

const RETRYABLE = new Set([Code.DataLoss, Code.Unavailable, Code.DeadlineExceeded]);
/** Codes that say an engine is down or slow rather than that the request was wrong. */
const SUSPICIOUS = new Set([Code.Unavailable, Code.DeadlineExceeded]);

/**
 * What to do after a failed Prefill: route again without `exclude` (null: without
 * excluding anyone, the suspects steer), or give up. `suspect` names the engines the
 * failure makes suspect, whatever the decision.
 */
export type RetryDecision = ({ again: true; exclude: string | null; why: string } | { again: false }) & { suspect: string[] };

/**
 * One request's retry policy over pairs. Corruption, an unreachable engine or a
 * deadline is retried once on another pair, without the engine that failed (the side
 * P names in its error); an unreachable engine or a missed deadline also makes it
 * suspect. A deadline of the gateway's own (P never answered, so no side is named)
 * blames neither alone: both become suspect, and the retry prefers healthy engines.
 * A decode engine with no room, or a worker refusing the request outright, routes
 * elsewhere; anything else is the client's answer.
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
    const named = err.metadata.has(FAILED_SIDE_HEADER);
    const blame = failedSideOf(err.metadata) === "decode" ? decodeId : prefillId;
    const suspect = !SUSPICIOUS.has(err.code) ? [] : named ? [blame] : [prefillId, decodeId];
    if (RETRYABLE.has(err.code) && !this.retried) {
      this.retried = true;
      const exclude = named || err.code !== Code.DeadlineExceeded ? blame : null;
      return { again: true, exclude, why: "prefill failed; retrying on another pair", suspect };
    }
    // A decode engine out of blocks is a fact about that engine: another may have room.
    if (err.code === Code.ResourceExhausted && blame === decodeId) {
      this.retried = true;
      return { again: true, exclude: decodeId, why: "decode engine has no room; routing elsewhere", suspect };
    }
    if (err.code === Code.FailedPrecondition) return { again: true, exclude: blame, why: "worker refused the request; routing elsewhere", suspect };
    return { again: false, suspect };
  }

  /** The engine failed the stream before anything reached the client; the caller routes again without it. */
  streamFailed(): void {
    this.retried = true;
  }
}
