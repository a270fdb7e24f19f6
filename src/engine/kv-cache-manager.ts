import assert from "node:assert";
import type { KvPool } from "../pool/index.ts";

/**
 * A step holding sequences' blocks while the model may still read or write them: blocks given
 * back meanwhile wait in `deferred` until it settles (KvCacheManager.settle).
 */
export interface BlockHold {
  readonly deferred: number[];
}

/**
 * One sequence's blocks as the manager hands them out (vLLM's KVCacheBlocks): their ids in
 * position order, read-only outside the manager, which alone takes and gives back blocks.
 */
export class KvBlocks {
  protected table: number[] = [];
  /** The newest step in flight that holds these blocks (steps settle in order), null when none. */
  protected holder: BlockHold | null = null;
  /** The block ids, position p in ids[floor(p / blockTokens)]; the same array until the blocks are freed. */
  get ids(): readonly number[] {
    return this.table;
  }
  get count(): number {
    return this.table.length;
  }
  get held(): boolean {
    return this.holder !== null;
  }
}

/** The manager's side of KvBlocks: the one place a table changes. */
class OwnedBlocks extends KvBlocks {
  get mutable(): number[] {
    return this.table;
  }
  set mutable(t: number[]) {
    this.table = t;
  }
  get hold(): BlockHold | null {
    return this.holder;
  }
  set hold(h: BlockHold | null) {
    this.holder = h;
  }
}

function own(b: KvBlocks): OwnedBlocks {
  assert(b instanceof OwnedBlocks, "KvBlocks not made by a KvCacheManager");
  return b;
}

/**
 * The block accounting of the engine's sequences over one KvPool: which blocks each sequence
 * holds, prefix hits, fills and hashes as positions are computed, and when blocks go back.
 *
 * Invariant: every id in a table is one pool reference that table owns, and it goes back to the
 * pool exactly once: when the table is freed or handed off, or, while a step that holds the
 * table is in flight (hold), when the newest such step settles, so no block the model may still
 * write is zeroed, imported into or handed to another request. A block is named (registered for
 * prefix hits) only once every one of its positions is computed.
 */
export class KvCacheManager {
  private readonly B: number;

  constructor(readonly pool: KvPool) {
    this.B = pool.shape.blockTokens;
  }

  get blockTokens(): number {
    return this.B;
  }
  /** Blocks the pool can hand out now (free or cached), and its size. */
  get available(): number {
    return this.pool.available;
  }
  get total(): number {
    return this.pool.total;
  }

  /** A new, empty table. */
  open(): KvBlocks {
    return new OwnedBlocks();
  }

  /** A table over blocks the caller gives its references on (a resumed prompt's). */
  adopt(ids: readonly number[]): KvBlocks {
    const b = new OwnedBlocks();
    b.mutable = [...ids];
    return b;
  }

  /** Blocks `tokens` positions take. */
  blocksFor(tokens: number): number {
    return Math.ceil(tokens / this.B);
  }

  /** More blocks the table needs to cover `upTo` positions (0 when it does). */
  shortOf(b: KvBlocks, upTo: number): number {
    return Math.max(0, this.blocksFor(upTo) - b.count);
  }

  /** Makes the table cover `upTo` positions from the pool's free and cached blocks; null (nothing taken) when it is short. */
  allocate(b: KvBlocks, upTo: number): KvBlocks | null {
    const t = own(b);
    const need = this.shortOf(t, upTo);
    if (need === 0) return t;
    const ids = this.pool.allocate(need);
    if (ids === null) return null;
    t.mutable.push(...ids);
    return t;
  }

  /**
   * Takes references on the cached blocks named by `hashes` (a sequence's chained block hashes)
   * that start an empty table, at most `maxHits`; returns how many.
   */
  takePrefixHits(b: KvBlocks, hashes: readonly bigint[], maxHits: number): number {
    const t = own(b);
    assert(t.count === 0, "prefix hits start an empty table");
    for (let i = 0; i < maxHits && i < hashes.length; i++) {
      const id = this.pool.lookup(hashes[i]!);
      if (id < 0) break;
      this.pool.acquire(id);
      t.mutable.push(id);
    }
    return t.count;
  }

  /** Positions from..to are computed: their blocks' fills are set, and blocks full by now are named with `hashes`. */
  markComputed(b: KvBlocks, hashes: readonly bigint[], from: number, to: number): void {
    const B = this.B;
    const ids = own(b).ids;
    assert(to <= ids.length * B, "computed past the table");
    const last = Math.ceil(to / B) - 1;
    for (let i = Math.floor(from / B); i <= last; i++) this.pool.setFill(ids[i]!, Math.min(B, to - i * B));
    const full = Math.floor(to / B);
    assert(hashes.length >= full, "a full block without its hash");
    for (let i = Math.floor(from / B); i < full; i++) {
      const id = ids[i]!;
      if (this.pool.hashOf(id) === 0n) this.pool.register(id, hashes[i]!);
    }
  }

  /** Gives every block of the table back (now, or when its holding step settles); the table is empty after. */
  free(b: KvBlocks): void {
    const t = own(b);
    this.giveBack(t, t.mutable);
    t.mutable = [];
  }

  /**
   * Empties the table and hands its first `blocksFor(promptLen)` blocks to the caller, who owns
   * one reference on each from here; the rest go back.
   */
  handOff(b: KvBlocks, promptLen: number): number[] {
    const t = own(b);
    const n = this.blocksFor(promptLen);
    const out = t.mutable.slice(0, n);
    this.giveBack(t, t.mutable.slice(n));
    t.mutable = [];
    return out;
  }

  /**
   * References a resumed prompt's blocks once more, for one more sequence of the same
   * prompt (n > 1 after one prefill): full blocks are shared read-only, a partial tail is
   * copied since each sequence writes its own tokens there. Null when no block is free.
   */
  sharePrompt(blockIds: readonly number[], promptLen: number): number[] | null {
    const full = Math.floor(promptLen / this.B);
    const out = blockIds.slice(0, full);
    if (full < blockIds.length) {
      const tail = blockIds[full]!;
      const copy = this.pool.importBlock(this.pool.payload(tail), this.pool.fillOf(tail));
      if (copy < 0) return null;
      out.push(copy);
    }
    for (let i = 0; i < full; i++) this.pool.acquire(out[i]!);
    return out;
  }

  /** `step` is in flight with this table: what is given back meanwhile waits for it (the newest holder). */
  hold(b: KvBlocks, step: BlockHold): void {
    own(b).hold = step;
  }

  /** `step` settled: if it was the table's newest holder, what is given back from here goes at once. */
  unhold(b: KvBlocks, step: BlockHold): void {
    const t = own(b);
    if (t.hold === step) t.hold = null;
  }

  /** `step` settled (unhold done for each of its rows): the blocks given back while it ran go back. */
  settle(step: BlockHold): void {
    if (step.deferred.length > 0) {
      this.pool.releaseAll(step.deferred);
      step.deferred.length = 0;
    }
  }

  private giveBack(t: OwnedBlocks, ids: readonly number[]): void {
    const step = t.hold;
    if (step === null) this.pool.releaseAll(ids);
    else for (let i = 0; i < ids.length; i++) step.deferred.push(ids[i]!);
  }
}
