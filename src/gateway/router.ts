import { Role } from "../gen/tl/control/v1/control_pb.ts";
import type { WorkerView } from "./worker-registry.ts";

/**
 * Which decode engine probably caches which prompt blocks, from the hashes of the
 * pushes the gateway routed there. Approximate by design (D evicts on its own), so
 * it only orders candidates; HasBlocks at push time decides what actually moves.
 */
export class KvAffinity {
  private readonly byWorker = new Map<string, Map<bigint, true>>();

  constructor(private readonly capPerWorker = 65_536) {}

  record(workerId: string, hashes: readonly bigint[]): void {
    let set = this.byWorker.get(workerId);
    if (!set) this.byWorker.set(workerId, (set = new Map()));
    for (const h of hashes) {
      set.delete(h); // re-insert: most recent last
      set.set(h, true);
    }
    for (const h of set.keys()) {
      if (set.size <= this.capPerWorker) break;
      set.delete(h);
    }
  }

  forget(workerId: string): void {
    this.byWorker.delete(workerId);
  }

  /** How many of the prompt's first blocks this worker is believed to hold. */
  leadingHits(workerId: string, hashes: readonly bigint[]): number {
    const set = this.byWorker.get(workerId);
    if (!set) return 0;
    let n = 0;
    while (n < hashes.length && set.has(hashes[n]!)) n++;
    return n;
  }
}

export interface Pick {
  worker: WorkerView;
  why: string;
}

/** Work a worker has: what it last reported plus what this gateway sent since. */
function load(w: WorkerView, inflight: ReadonlyMap<string, number>): number {
  return w.status.queueDepth + w.status.running + (inflight.get(w.status.workerId) ?? 0);
}

function byLoad(inflight: ReadonlyMap<string, number>) {
  return (a: WorkerView, b: WorkerView) =>
    load(a, inflight) - load(b, inflight) || b.status.freeBlocks - a.status.freeBlocks || (a.status.workerId < b.status.workerId ? -1 : 1);
}

function describe(w: WorkerView, inflight: ReadonlyMap<string, number>): string {
  return `${w.status.workerId} (queue ${w.status.queueDepth}, running ${w.status.running}, in flight ${inflight.get(w.status.workerId) ?? 0}, free blocks ${w.status.freeBlocks})`;
}

/** The least loaded worker of exactly `role` outside `exclude`. */
export function pickByLoad(workers: readonly WorkerView[], role: Role, inflight: ReadonlyMap<string, number>, exclude: ReadonlySet<string>): Pick | null {
  const cands = workers.filter((w) => w.status.role === role && !exclude.has(w.status.workerId)).sort(byLoad(inflight));
  const best = cands[0];
  if (!best) return null;
  return { worker: best, why: `least loaded of ${cands.length}: ${describe(best, inflight)}` };
}

/** The decode engine holding the most leading prompt blocks, then the least loaded. */
export function pickDecode(
  workers: readonly WorkerView[],
  hashes: readonly bigint[],
  affinity: KvAffinity,
  inflight: ReadonlyMap<string, number>,
  exclude: ReadonlySet<string>,
): (Pick & { hits: number }) | null {
  const cands = workers.filter((w) => w.status.role === Role.DECODE && !exclude.has(w.status.workerId));
  if (cands.length === 0) return null;
  const hits = new Map(cands.map((w) => [w.status.workerId, affinity.leadingHits(w.status.workerId, hashes)]));
  const loadOrder = byLoad(inflight);
  cands.sort((a, b) => hits.get(b.status.workerId)! - hits.get(a.status.workerId)! || loadOrder(a, b));
  const best = cands[0]!;
  const n = hits.get(best.status.workerId)!;
  const why =
    n > 0
      ? `kv affinity: holds ${n} of ${hashes.length} leading prompt blocks; ${describe(best, inflight)}`
      : `no cached prefix on any of ${cands.length}; least loaded: ${describe(best, inflight)}`;
  return { worker: best, why, hits: n };
}
