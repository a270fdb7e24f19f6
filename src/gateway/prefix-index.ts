import type { KvEvents } from "../gen/tl/control/v1/control_pb.ts";

export interface PrefixIndexOptions {
  /** Most blocks reported by all engines together; beyond it the least recently reported go ([gateway] prefix_index_max_blocks). */
  maxBlocks: number;
  /** Most blocks this gateway's own routing decisions may add per engine (default 65 536). */
  maxProvisionalPerWorker?: number;
}

/** What the gateway answers a beat's events with (HeartbeatAck.kv_next_seq, kv_snapshot). */
export interface EventsAnswer {
  nextSeq: bigint;
  snapshot: boolean;
}

interface WorkerBlocks {
  /** key → stamp of its last report; insertion order is report order, so the first is the least recent. */
  reported: Map<number, number>;
  /** Blocks this gateway routed there since the engine's last caught-up beat, and the generation before. */
  provisional: Map<number, true>;
  older: Map<number, true>;
  epoch: bigint;
  /** The seq the next event must have; meaningful once synced. */
  next: bigint;
  /** A snapshot was applied in full and no gap seen since. */
  synced: boolean;
  /** The snapshot piece expected next, or -1 outside a snapshot. */
  snapNext: number;
}

/**
 * Which decode engine holds which prompt blocks, as the engines say (KV events in their
 * beats, docs/grpc-services.md "KV events"), plus this gateway's own routing decisions,
 * which only fill the gap until the engine's next caught-up beat: a decision survives one
 * such beat (the push it describes may have landed just after the beat left the engine)
 * and is dropped at the second. An engine that reports no events keeps the decisions
 * alone, as before events existed.
 *
 * Blocks are keyed by their chained hash as the nearest double (its top 53 bits, no heap object):
 * the index only orders candidates, and HasBlocks at push time decides what moves, so a
 * collision at 2^-53 costs at most one worse route. Bounded: beyond `maxBlocks` reported
 * blocks the least recently reported go first, whichever engine reported them.
 */
export class PrefixIndex {
  readonly maxBlocks: number;
  readonly maxProvisionalPerWorker: number;
  private readonly byWorker = new Map<string, WorkerBlocks>();
  private stamp = 0;
  private total = 0;

  constructor(opts: PrefixIndexOptions) {
    this.maxBlocks = opts.maxBlocks;
    this.maxProvisionalPerWorker = opts.maxProvisionalPerWorker ?? 65_536;
    if (!(this.maxBlocks >= 1 && this.maxProvisionalPerWorker >= 1)) {
      throw new RangeError(`prefix index: maxBlocks ${this.maxBlocks} and maxProvisionalPerWorker ${this.maxProvisionalPerWorker} must be ≥ 1`);
    }
  }

  /** Reported blocks held, all engines together (≤ maxBlocks). */
  get size(): number {
    return this.total;
  }

  /** This gateway routed a push of these blocks to `workerId`: believed held until the engine says otherwise. */
  record(workerId: string, hashes: readonly bigint[]): void {
    const w = this.worker(workerId);
    for (const h of hashes) {
      const k = key(h);
      w.provisional.delete(k); // re-insert: most recent last
      w.provisional.set(k, true);
    }
    for (const k of w.provisional.keys()) {
      if (w.provisional.size <= this.maxProvisionalPerWorker) break;
      w.provisional.delete(k);
    }
  }

  /**
   * Applies one beat's events from `workerId` (whose identity the registry has checked)
   * and says what the gateway wants next: the seq it expects, or a snapshot when it sees a
   * gap, another epoch (a restarted engine) or a snapshot piece out of order.
   */
  apply(workerId: string, ev: KvEvents): EventsAnswer {
    const w = this.worker(workerId);
    if (ev.snapshot) return this.applySnapshot(w, ev);
    if (!w.synced || ev.epoch !== w.epoch || ev.firstSeq > w.next) return this.lost(w);
    let seq = ev.firstSeq;
    for (const e of ev.events) {
      for (const h of e.hashes) {
        // Events before w.next were applied already (a beat resent after its ack was lost).
        if (seq++ < w.next) continue;
        if (e.removed) this.drop(w, key(h));
        else this.put(w, key(h));
      }
    }
    if (seq > w.next) w.next = seq;
    if (!ev.more) this.caughtUp(w);
    this.bound();
    return { nextSeq: w.next, snapshot: false };
  }

  /** Forgets an engine (the registry dropped it). */
  forget(workerId: string): void {
    const w = this.byWorker.get(workerId);
    if (w === undefined) return;
    this.total -= w.reported.size;
    this.byWorker.delete(workerId);
  }

  /** How many of the prompt's first blocks `workerId` is believed to hold. */
  leadingHits(workerId: string, hashes: readonly bigint[]): number {
    const w = this.byWorker.get(workerId);
    if (!w) return 0;
    let n = 0;
    while (n < hashes.length) {
      const k = key(hashes[n]!);
      if (!(w.reported.has(k) || w.provisional.has(k) || w.older.has(k))) break;
      n++;
    }
    return n;
  }

  private applySnapshot(w: WorkerBlocks, ev: KvEvents): EventsAnswer {
    if (ev.snapshotIndex === 0) {
      this.total -= w.reported.size;
      w.reported.clear();
      w.epoch = ev.epoch;
      w.synced = false;
      w.snapNext = 0;
    } else if (ev.snapshotIndex !== w.snapNext || ev.epoch !== w.epoch) {
      return this.lost(w);
    }
    for (const e of ev.events) for (const h of e.hashes) if (!e.removed) this.put(w, key(h));
    w.snapNext++;
    if (ev.snapshotLast) {
      w.snapNext = -1;
      w.synced = true;
      w.next = ev.firstSeq;
      this.caughtUp(w);
    }
    this.bound();
    return { nextSeq: w.next, snapshot: false };
  }

  private lost(w: WorkerBlocks): EventsAnswer {
    w.synced = false;
    w.snapNext = -1;
    return { nextSeq: w.next, snapshot: true };
  }

  private caughtUp(w: WorkerBlocks): void {
    w.older = w.provisional;
    w.provisional = new Map();
  }

  private put(w: WorkerBlocks, k: number): void {
    if (w.reported.delete(k)) this.total--;
    w.reported.set(k, ++this.stamp);
    this.total++;
  }

  private drop(w: WorkerBlocks, k: number): void {
    if (w.reported.delete(k)) this.total--;
    w.provisional.delete(k);
    w.older.delete(k);
  }

  /** Evicts the least recently reported blocks, across engines, down to maxBlocks. */
  private bound(): void {
    while (this.total > this.maxBlocks) {
      let oldest: WorkerBlocks | null = null;
      let oldestStamp = Number.POSITIVE_INFINITY;
      let oldestKey = 0;
      for (const w of this.byWorker.values()) {
        for (const [k, s] of w.reported) {
          if (s < oldestStamp) {
            oldest = w;
            oldestStamp = s;
            oldestKey = k;
          }
          break;
        }
      }
      if (oldest === null) return;
      oldest.reported.delete(oldestKey);
      this.total--;
    }
  }

  private worker(workerId: string): WorkerBlocks {
    let w = this.byWorker.get(workerId);
    if (!w) {
      w = { reported: new Map(), provisional: new Map(), older: new Map(), epoch: 0n, next: 0n, synced: false, snapNext: -1 };
      this.byWorker.set(workerId, w);
    }
    return w;
  }
}

/** A chained hash (a uint64) as the nearest double: its top 53 bits, rounded; no BigInt is allocated. */
function key(h: bigint): number {
  return Number(h);
}
