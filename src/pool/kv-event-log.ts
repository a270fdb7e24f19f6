import assert from "node:assert";
import type { KvPool, KvPoolWatcher } from "./kv-pool.ts";

/** One slice of the log, as `read` returns it: `hashes[i]` was stored (removed[i] 0) or evicted (1). */
export interface KvEventSlice {
  /** Seq of the first event; the others follow consecutively. */
  firstSeq: bigint;
  hashes: BigUint64Array;
  removed: Uint8Array;
}

/**
 * A pool's KV events, numbered from 1: every hash it names (stored) and every hash it
 * drops by eviction (removed), in the order they happened, kept in a ring of `capacity`.
 *
 * Invariant: the ring holds exactly the events `oldestSeq .. nextSeq - 1`, and
 * `nextSeq - oldestSeq <= capacity`. A reader whose cursor is older than `oldestSeq`
 * lost events and must start over from a snapshot (the pool's named hashes, taken at
 * `nextSeq`). Recording allocates nothing: two typed arrays, written in place.
 */
export class KvEventLog implements KvPoolWatcher {
  readonly capacity: number;
  /** Random per log: a reader seeing another epoch knows the seqs started afresh. */
  readonly epoch: bigint;
  private readonly hashes: BigUint64Array;
  private readonly removedFlags: Uint8Array;
  /** Seq of the next event, as a number (exact to 2^53 events): recording does no BigInt arithmetic. */
  private next = 1;
  /** Events recorded, stored + removed, since the log began (for the bench's traffic figure). */
  recorded = 0;
  /** Called after each event is recorded (the engine sends its beats early: KV_EVENT_FLUSH_MS). Keep it cheap. */
  onAppend: (() => void) | null = null;

  constructor(capacity: number, epoch: bigint = randomEpoch()) {
    if (!(Number.isInteger(capacity) && capacity >= 1)) assert.fail(`capacity must be ≥ 1, got ${capacity}`);
    this.capacity = capacity;
    this.epoch = epoch;
    this.hashes = new BigUint64Array(capacity);
    this.removedFlags = new Uint8Array(capacity);
  }

  /** A log of `capacity` that watches `pool` from now on. */
  static watching(pool: KvPool, capacity = Math.max(4 * pool.total, 4096)): KvEventLog {
    const log = new KvEventLog(capacity);
    pool.watch(log);
    return log;
  }

  /** Seq the next event will get. */
  get nextSeq(): bigint {
    return BigInt(this.next);
  }

  /** Seq of the oldest event still held (nextSeq when the log is empty). */
  get oldestSeq(): bigint {
    return BigInt(this.next - Math.min(this.next - 1, this.capacity));
  }

  stored(hash: bigint): void {
    this.push(hash, 0);
  }

  removed(hash: bigint): void {
    this.push(hash, 1);
  }

  private push(hash: bigint, removed: 0 | 1): void {
    const at = this.next % this.capacity;
    this.hashes[at] = hash;
    this.removedFlags[at] = removed;
    this.next++;
    this.recorded++;
    this.onAppend?.();
  }

  /**
   * Up to `max` events from `fromSeq` on, or null when `fromSeq` is older than the log
   * holds (the reader must take a snapshot). `fromSeq` past the end reads nothing.
   */
  read(fromSeq: bigint, max: number): KvEventSlice | null {
    if (fromSeq < this.oldestSeq) return null;
    const from = fromSeq > BigInt(this.next) ? this.next : Number(fromSeq);
    const n = Math.min(this.next - from, max);
    const hashes = new BigUint64Array(n);
    const removed = new Uint8Array(n);
    for (let i = 0; i < n; i++) {
      const at = (from + i) % this.capacity;
      hashes[i] = this.hashes[at]!;
      removed[i] = this.removedFlags[at]!;
    }
    return { firstSeq: BigInt(from), hashes, removed };
  }
}

function randomEpoch(): bigint {
  const b = new BigUint64Array(1);
  crypto.getRandomValues(b);
  return b[0] === 0n ? 1n : b[0]!;
}
