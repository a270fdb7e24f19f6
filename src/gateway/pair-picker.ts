import type { ConnectError } from "@connectrpc/connect";
import { promptHashes } from "../codec/index.ts";
import { Role } from "../gen/tl/control/v1/control_pb.ts";
import { FAILED_SIDE_HEADER, failedSideOf } from "../handoff/index.ts";
import { Code } from "../rpc/status.ts";
import { type CostWeights, type DecodePick, type Pick, pickByLoad, pickDecode, type Suspects } from "./router.ts";
import type { PrefixIndex } from "./prefix-index.ts";
import type { WorkerRegistry, WorkerView } from "./worker-registry.ts";

/**
 * Requests this gateway routed to each worker and has not seen finish. A request is
 * counted from the moment a worker is chosen for it (reserve) until its release runs,
 * which every outcome must call; a release runs at most once. Each reservation keeps the
 * time it was made, so `unreported` can tell the ones a worker's last beat cannot have
 * counted yet.
 */
export class InFlight {
  readonly byWorker = new Map<string, number>();
  private readonly since = new Map<string, number[]>();
  /**
   * Per worker, requests released lately: [reserved at, released at]. One reserved before a beat
   * and released after it was counted by that beat's report and is done now (a stream that ended
   * just before the next request must not make its engine look busy until the next beat).
   */
  private readonly ended = new Map<string, [number, number][]>();

  constructor(private readonly now: () => number = Date.now) {}

  add(workerId: string, d: number): void {
    this.byWorker.set(workerId, (this.byWorker.get(workerId) ?? 0) + d);
  }

  /** Counts one request on `workerId` now; the returned release uncounts it (idempotent). */
  reserve(workerId: string): () => void {
    this.add(workerId, 1);
    const at = this.now();
    let times = this.since.get(workerId);
    if (!times) this.since.set(workerId, (times = []));
    times.push(at);
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.add(workerId, -1);
      let ended = this.ended.get(workerId);
      if (!ended) this.ended.set(workerId, (ended = []));
      const now = this.now();
      ended.push([at, now]);
      // Bounded: a release older than any beat interval has been reported by now.
      while (ended.length > 0 && (ended.length > MAX_ENDED || now - ended[0]![1] > ENDED_KEEP_MS)) ended.shift();
      const i = times.indexOf(at);
      if (i >= 0) times.splice(i, 1);
      if (times.length === 0 && this.since.get(workerId) === times) this.since.delete(workerId);
    };
  }

  /**
   * Per worker, this replica's requests reserved at or after the worker's last beat arrived:
   * those its report cannot include. Load is what the engine reports plus these, so several
   * replicas add up without counting one request twice once it is reported (router.ts, loadOf).
   */
  unreported(workers: readonly WorkerView[]): Map<string, number> {
    const out = new Map<string, number>();
    for (const w of workers) {
      const seen = w.lastSeenUnixMs;
      let n = 0;
      for (const t of this.since.get(w.status.workerId) ?? []) if (t >= seen) n++;
      // Counted by the last report, done since: that report over-counts them.
      for (const [at, done] of this.ended.get(w.status.workerId) ?? []) if (at < seen && done >= seen) n--;
      if (n !== 0) out.set(w.status.workerId, n);
    }
    return out;
  }
}

/** Releases kept for `unreported`: the newest this many, none older than this. */
const MAX_ENDED = 4096;
const ENDED_KEEP_MS = 60_000;

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
    private readonly affinity: PrefixIndex,
    private readonly inflight: InFlight,
    private readonly weights: CostWeights,
    private readonly suspects?: Suspects,
  ) {}

  pair(promptTokens: readonly number[], exclude: ReadonlySet<string>): Pair | null {
    const workers = this.registry.live();
    const unreported = this.inflight.unreported(workers);
    const prefill = pickByLoad(workers, Role.PREFILL, unreported, exclude, this.suspects);
    if (!prefill) return null;
    const hashes = promptHashes(promptTokens, prefill.worker.status.blockTokens);
    const decode = pickDecode(workers, hashes, this.affinity, unreported, exclude, this.weights, this.suspects);
    if (!decode) return null;
    return {
      prefill,
      decode,
      releasePrefill: this.inflight.reserve(prefill.worker.status.workerId),
      releaseDecode: this.inflight.reserve(decode.worker.status.workerId),
    };
  }

  colocated(exclude: ReadonlySet<string>): Reserved | null {
    const workers = this.registry.live();
    const pick = pickByLoad(workers, Role.BOTH, this.inflight.unreported(workers), exclude, this.suspects);
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
