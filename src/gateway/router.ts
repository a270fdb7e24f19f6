import { Role } from "../gen/tl/control/v1/control_pb.ts";
import type { PrefixIndex } from "./prefix-index.ts";
import type { WorkerView } from "./worker-registry.ts";

/**
 * Engines that recently missed a deadline (or a heartbeat). A suspect is scored out
 * while any other candidate is left, for `cooldownMs` after its last miss, so new work
 * routes around a frozen engine long before the registry evicts it; when every
 * candidate is suspect they are used anyway, least recently marked first.
 */
export class Suspects {
  private readonly until = new Map<string, number>();
  private readonly watchers = new Map<string, AbortController>();

  constructor(
    readonly cooldownMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  mark(workerId: string): void {
    this.until.set(workerId, this.now() + this.cooldownMs);
    this.watchers.get(workerId)?.abort(new Error(`${workerId} became suspect`));
    this.watchers.delete(workerId);
  }

  /** Aborts when `workerId` is next marked, so work waiting on it can go elsewhere at once. */
  signal(workerId: string): AbortSignal {
    let c = this.watchers.get(workerId);
    if (!c) this.watchers.set(workerId, (c = new AbortController()));
    return c.signal;
  }

  has(workerId: string): boolean {
    const t = this.until.get(workerId);
    if (t === undefined) return false;
    if (t > this.now()) return true;
    this.until.delete(workerId);
    return false;
  }
}

/** Whether `w` may be slow or frozen: marked suspect, or a whole beat interval late. */
function suspect(w: WorkerView, suspects: Suspects | undefined): boolean {
  return w.missed >= 1 || (suspects?.has(w.status.workerId) ?? false);
}

/** The candidates to score: the healthy ones, or all of them when none is. */
function healthy(cands: WorkerView[], suspects: Suspects | undefined): WorkerView[] {
  const ok = cands.filter((w) => !suspect(w, suspects));
  return ok.length > 0 ? ok : cands;
}

export interface Pick {
  worker: WorkerView;
  why: string;
}

/**
 * Requests a worker has: what it last reported (queued + running, every replica's work)
 * plus what this gateway reserved on it since that report (InFlight.unreported). The
 * reservations count from the routing decision, so a burst sees its own earlier choices;
 * once the worker's beat reports a request it counts there alone, so it never counts twice,
 * and another replica's requests count as soon as the worker reports them.
 */
export function loadOf(w: WorkerView, unreported: ReadonlyMap<string, number>): number {
  // Never below 0: a release the report counted can only take back what it reported.
  return Math.max(0, w.status.queueDepth + w.status.running + (unreported.get(w.status.workerId) ?? 0));
}

function byLoad(inflight: ReadonlyMap<string, number>) {
  return (a: WorkerView, b: WorkerView) =>
    loadOf(a, inflight) - loadOf(b, inflight) || b.status.freeBlocks - a.status.freeBlocks || (a.status.workerId < b.status.workerId ? -1 : 1);
}

function describe(w: WorkerView, inflight: ReadonlyMap<string, number>): string {
  return `${w.status.workerId} (queue ${w.status.queueDepth}, running ${w.status.running}, in flight ${inflight.get(w.status.workerId) ?? 0}, free blocks ${w.status.freeBlocks})`;
}

/** The least loaded healthy worker of exactly `role` outside `exclude`. */
export function pickByLoad(
  workers: readonly WorkerView[],
  role: Role,
  inflight: ReadonlyMap<string, number>,
  exclude: ReadonlySet<string>,
  suspects?: Suspects,
): Pick | null {
  const all = workers.filter((w) => w.status.role === role && !exclude.has(w.status.workerId));
  const cands = healthy(all, suspects).sort(byLoad(inflight));
  const best = cands[0];
  if (!best) return null;
  return { worker: best, why: `least loaded of ${cands.length} healthy (${all.length} live): ${describe(best, inflight)}` };
}

/**
 * The decode-engine cost's weights, in prompt blocks. As Dynamo's KV router
 * (overlap_score_weight × prefill blocks + decode load) and llm-d's weighted
 * prefix-cache + load scorers:
 *
 *     cost(D) = overlap × (prompt blocks D does not hold) + load × (requests on D)
 *
 * `overlap` prices a block D must receive (or compute, when prefilled there);
 * `load` prices one request already running on D, in blocks: with the defaults
 * (1, 8) an engine holding the whole prompt still loses to an idle one once it
 * runs more requests than the prompt has blocks / 8. Lowest cost wins; ties go to
 * the most free blocks, then the worker id.
 */
export interface CostWeights {
  overlap: number;
  load: number;
}

export interface DecodePick extends Pick {
  /** Leading prompt blocks the chosen engine is believed to hold. */
  hits: number;
}

/** The healthy decode engine of lowest cost (see CostWeights). */
export function pickDecode(
  workers: readonly WorkerView[],
  hashes: readonly bigint[],
  affinity: PrefixIndex,
  inflight: ReadonlyMap<string, number>,
  exclude: ReadonlySet<string>,
  weights: CostWeights,
  suspects?: Suspects,
): DecodePick | null {
  const all = workers.filter((w) => w.status.role === Role.DECODE && !exclude.has(w.status.workerId));
  const cands = healthy(all, suspects);
  if (cands.length === 0) return null;
  const hits = new Map(cands.map((w) => [w.status.workerId, affinity.leadingHits(w.status.workerId, hashes)]));
  const cost = new Map(
    cands.map((w) => [w.status.workerId, weights.overlap * (hashes.length - hits.get(w.status.workerId)!) + weights.load * loadOf(w, inflight)]),
  );
  const tie = byLoad(inflight);
  cands.sort((a, b) => cost.get(a.status.workerId)! - cost.get(b.status.workerId)! || tie(a, b));
  const best = cands[0]!;
  const id = best.status.workerId;
  const n = hits.get(id)!;
  const why = `lowest cost ${cost.get(id)} of ${cands.length} healthy (${all.length} live): holds ${n} of ${hashes.length} leading prompt blocks; ${describe(best, inflight)}`;
  return { worker: best, why, hits: n };
}
