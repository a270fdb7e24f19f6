import assert from "node:assert";
import type { EnvelopeRecord } from "../codec/envelope.ts";
import { crc32c } from "../codec/crc32c.ts";
import { blockPayloadBytes, copyPayload, type KvShape } from "../codec/kv-shape.ts";

/**
 * Told of every change to the prefix index: a hash named (a full block the pool now
 * holds, used or cached) or dropped (its block evicted). The partial tail of a prompt is
 * never named, so it is never reported. Called synchronously inside the pool's method.
 */
export interface KvPoolWatcher {
  stored(hash: bigint): void;
  removed(hash: bigint): void;
}

const NONE = -1;

export interface KvPoolOptions {
  /** Put the slab on a SharedArrayBuffer, so another thread can see the same bytes. */
  shared?: boolean;
  /** Use this slab (another thread's pool's, as `slab` gives it) instead of a fresh zeroed one. */
  slab?: SharedArrayBuffer;
  /**
   * Where the pool's bytes start in `slab` (default 0, and then the slab must be exactly the
   * pool's size): a pool may live inside a bigger shared buffer, such as the model kernels'
   * memory, where attention reads the blocks in place.
   */
  slabOffset?: number;
  /**
   * The pool split by layer (instead of slab/shared): each segment holds its layers' share of
   * every block in a buffer of its own, in layer order, together every layer once. A model in
   * several kernel memories gives each memory its layers' share, so attention reads it in place.
   */
  segments?: readonly KvSegmentRoom[];
}

/** Where one segment of a pool split by layer lives (KvPoolOptions.segments). */
export interface KvSegmentRoom {
  slab: SharedArrayBuffer;
  /** 16-aligned; the segment takes numBlocks × its share of a block from here. */
  slabOffset: number;
  firstLayer: number;
  nLayers: number;
}

/**
 * Layers firstLayer .. firstLayer + nLayers - 1 of every block: block id's share is
 * bytes[id * blockBytes, (id + 1) * blockBytes), laid out as those layers are in the payload
 * (which they take from payloadOffset on). A pool in one piece is one segment of every layer.
 */
export interface KvSegment {
  readonly firstLayer: number;
  readonly nLayers: number;
  readonly blockBytes: number;
  readonly blockElems: number;
  readonly payloadOffset: number;
  readonly bytes: Uint8Array;
  readonly data: Float16Array;
}

/**
 * A fixed set of KV-cache blocks in one preallocated slab, with refcounts and a prefix
 * index from chained block hash to block.
 *
 * Every block is in exactly one state:
 * - used:   refcount > 0 (a running sequence or a pending handle holds it);
 * - cached: refcount 0, owns a hash in the prefix index, sits in the LRU list;
 * - free:   refcount 0, no hash, sits in the free stack.
 * so `used + cached + free === total` always.
 *
 * Allocation takes free blocks first, then evicts cached blocks least recently
 * released first (the LRU head), dropping their hashes from the index. A block becomes
 * the most recently used when its last reference is released. `lookup` neither takes a
 * reference nor touches the LRU order, so asking never changes what gets evicted.
 *
 * A block's payload is kv-block.md's v1 layout (per layer K then V, each [B][H][D] f16). In a
 * pool of one segment it is contiguous, so export is one view and import one `set`; a pool split
 * by layer (segments) keeps each layer range's share of every block in its own buffer, and a
 * payload is gathered from them in layer order. Slots at and past a block's fill are zero
 * because blocks are zeroed when handed out (importBlock writes them zero instead).
 *
 * A named block is full and its content final: it was registered once every slot was
 * computed (or imported), the model writes only past a sequence's computed tokens, and
 * prefix hits are shared read-only. So the CRC-32C of its payload is cached on first
 * export (payloadCrc) until the block is handed out again.
 *
 * The slab may be a SharedArrayBuffer, so a model thread writes K/V into it in place; all the
 * bookkeeping (refcounts, free stack, LRU, hashes, fills, CRCs) is this thread's alone, and a
 * block is written by the model thread only while a forward that holds it is in flight.
 */
export class KvPool {
  readonly shape: KvShape;
  readonly total: number;
  readonly blockBytes: number;
  readonly blockElems: number;
  /** In layer order; one unless the pool was built split by layer. */
  readonly segments: readonly KvSegment[];

  private readonly refs: Int32Array;
  private readonly fills: Int32Array;
  private readonly hashes: BigUint64Array;
  private readonly crcs: Uint32Array;
  private readonly crcValid: Uint8Array;
  private readonly index = new Map<bigint, number>();
  private readonly freeStack: Int32Array;
  private freeTop = 0;
  // LRU list of cached blocks: head is evicted first.
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private lruHead = NONE;
  private lruTail = NONE;
  private nUsed = 0;
  private nCached = 0;
  private readonly slotElems: number;
  private readonly segmentOfLayer: Int32Array;
  /** A split pool's payload gathered (payload), made on first use. */
  private gathered: Uint8Array | null = null;
  private watcher: KvPoolWatcher | null = null;

  constructor(shape: KvShape, numBlocks: number, opts: KvPoolOptions = {}) {
    if (!(Number.isInteger(numBlocks) && numBlocks >= 1)) assert.fail(`numBlocks must be ≥ 1, got ${numBlocks}`);
    for (const k of ["blockTokens", "nLayers", "nKvHeads", "headDim"] as const) {
      if (!(Number.isInteger(shape[k]) && shape[k] >= 1)) assert.fail(`${k} must be ≥ 1, got ${shape[k]}`);
    }
    this.shape = { ...shape };
    this.total = numBlocks;
    this.blockBytes = blockPayloadBytes(shape);
    this.blockElems = this.blockBytes / 2;
    this.slotElems = shape.nKvHeads * shape.headDim;
    const rooms = opts.segments ?? [{ ...oneSlab(numBlocks * this.blockBytes, opts), firstLayer: 0, nLayers: shape.nLayers }];
    this.segments = segmentsOf(this.shape, numBlocks, rooms, opts.segments === undefined && opts.slabOffset === undefined);
    this.segmentOfLayer = new Int32Array(shape.nLayers);
    this.segments.forEach((g, i) => this.segmentOfLayer.fill(i, g.firstLayer, g.firstLayer + g.nLayers));
    this.refs = new Int32Array(numBlocks);
    this.fills = new Int32Array(numBlocks);
    this.hashes = new BigUint64Array(numBlocks);
    this.crcs = new Uint32Array(numBlocks);
    this.crcValid = new Uint8Array(numBlocks);
    this.prev = new Int32Array(numBlocks).fill(NONE);
    this.next = new Int32Array(numBlocks).fill(NONE);
    this.freeStack = new Int32Array(numBlocks);
    // Low ids on top, so a fresh pool hands out 0, 1, 2, ...
    for (let i = 0; i < numBlocks; i++) this.freeStack[i] = numBlocks - 1 - i;
    this.freeTop = numBlocks;
  }

  /** Reports every hash named or dropped from now on to `w` (one watcher; null stops). */
  watch(w: KvPoolWatcher | null): void {
    this.watcher = w;
  }

  /** Every hash the prefix index holds now (used or cached blocks), in no order: a snapshot's source. */
  namedHashes(): bigint[] {
    return [...this.index.keys()];
  }

  /** Every block's bytes, as f16 (a pool of one segment only). */
  get data(): Float16Array {
    return this.whole().data;
  }

  /** Every block's bytes, block by block (a pool of one segment only). */
  get bytes(): Uint8Array {
    return this.whole().bytes;
  }

  /** The buffer under `data` and `bytes`: hand it to a model thread when it is shared (with slabOffset). */
  get slab(): ArrayBufferLike {
    return this.whole().bytes.buffer;
  }

  /** Where the pool's bytes start in `slab`. */
  get slabOffset(): number {
    return this.whole().bytes.byteOffset;
  }

  /** The segment holding layer l. */
  segmentOf(l: number): KvSegment {
    if (!(l >= 0 && l < this.shape.nLayers)) assert.fail(`layer ${l} outside 0..${this.shape.nLayers - 1}`);
    return this.segments[this.segmentOfLayer[l]!]!;
  }

  private whole(): KvSegment {
    if (this.segments.length !== 1) assert.fail(`a KV pool split into ${this.segments.length} segments by layer has no one view of its blocks`);
    return this.segments[0]!;
  }

  get used(): number {
    return this.nUsed;
  }
  get cached(): number {
    return this.nCached;
  }
  get free(): number {
    return this.freeTop;
  }
  /** Blocks a new request could get: free plus evictable cached. */
  get available(): number {
    return this.freeTop + this.nCached;
  }

  /** n zeroed blocks with refcount 1 and fill 0, or null (nothing taken) when short. */
  allocate(n: number): number[] | null {
    if (n > this.available) return null;
    const ids = new Array<number>(n);
    for (let i = 0; i < n; i++) ids[i] = this.takeOne();
    return ids;
  }

  /**
   * One fresh block (refcount 1, not named) holding `payload` at fill `fill`, or -1 when
   * none is available. The import path: the block is written once instead of zeroed and
   * then overwritten. Slots past the fill are zeroed here, whatever `payload` holds there,
   * so the pool's invariant does not depend on the sender.
   */
  importBlock(payload: Uint8Array, fill: number): number {
    if (payload.length !== this.blockBytes) assert.fail(`payload ${payload.length} bytes, want ${this.blockBytes}`);
    const B = this.shape.blockTokens;
    if (!(Number.isInteger(fill) && fill >= 1 && fill <= B)) assert.fail(`fill ${fill} outside 1..${B}`);
    if (this.available === 0) return NONE;
    const id = this.takeOne(false);
    for (const g of this.segments) {
      const part = g.nLayers === this.shape.nLayers ? payload : payload.subarray(g.payloadOffset, g.payloadOffset + g.blockBytes);
      copyPayload(g.bytes, id * g.blockBytes, part, fill, this.shape);
    }
    this.fills[id] = fill;
    return id;
  }

  private takeOne(zero = true): number {
    let id: number;
    if (this.freeTop > 0) {
      id = this.freeStack[--this.freeTop]!;
    } else {
      id = this.lruHead;
      assert(id !== NONE, "takeOne with nothing available");
      this.unlink(id);
      this.nCached--;
      const dropped = this.hashes[id]!;
      this.index.delete(dropped);
      this.hashes[id] = 0n;
      this.watcher?.removed(dropped);
    }
    if (this.refs[id] !== 0) assert.fail(`block ${id} handed out with refcount ${this.refs[id]}`);
    this.refs[id] = 1;
    this.fills[id] = 0;
    this.crcValid[id] = 0;
    this.nUsed++;
    if (zero) for (const g of this.segments) g.bytes.fill(0, id * g.blockBytes, (id + 1) * g.blockBytes);
    return id;
  }

  acquire(id: number): void {
    this.check(id);
    if (this.refs[id] === 0) {
      if (this.hashes[id] === 0n) assert.fail(`acquire of free block ${id}`);
      this.unlink(id);
      this.nCached--;
      this.nUsed++;
    }
    this.refs[id]!++;
  }

  release(id: number): void {
    this.check(id);
    if (this.refs[id]! <= 0) assert.fail(`release of block ${id} with refcount 0`);
    if (--this.refs[id]! > 0) return;
    this.nUsed--;
    if (this.hashes[id] !== 0n) {
      this.pushLru(id);
      this.nCached++;
    } else {
      this.freeStack[this.freeTop++] = id;
    }
  }

  releaseAll(ids: readonly number[]): void {
    for (const id of ids) this.release(id);
  }

  /** The block owning `hash`, or -1. Takes no reference and leaves the LRU order alone. */
  lookup(hash: bigint): number {
    return this.index.get(hash) ?? NONE;
  }

  /** Names a used block by its chained hash; false when another block owns the hash already. */
  register(id: number, hash: bigint): boolean {
    this.check(id);
    assert(hash !== 0n, "hash 0 means no hash");
    if (this.refs[id]! <= 0) assert.fail(`register of unreferenced block ${id}`);
    const owner = this.index.get(hash);
    if (owner !== undefined) return owner === id;
    if (this.hashes[id] !== 0n) return false;
    this.index.set(hash, id);
    this.hashes[id] = hash;
    this.watcher?.stored(hash);
    return true;
  }

  hashOf(id: number): bigint {
    return this.hashes[id]!;
  }
  fillOf(id: number): number {
    return this.fills[id]!;
  }
  setFill(id: number, n: number): void {
    if (!(n >= 0 && n <= this.shape.blockTokens)) assert.fail(`fill ${n} outside 0..${this.shape.blockTokens}`);
    this.fills[id] = n;
    this.crcValid[id] = 0;
  }
  refCount(id: number): number {
    return this.refs[id]!;
  }

  /** Element index into segmentOf(layer).data of the head_dim vector for (block, layer, K=0/V=1, slot, head). */
  offset(id: number, layer: number, kv: 0 | 1, slot: number, head: number): number {
    const g = this.segmentOf(layer);
    return id * g.blockElems + (((layer - g.firstLayer) * 2 + kv) * this.shape.blockTokens + slot) * this.slotElems + head * this.shape.headDim;
  }

  /**
   * Block id's payload: a view of the slab in a pool of one segment; in a pool split by layer,
   * the block gathered into one buffer the pool reuses, valid until the next call (every caller
   * copies or checksums it at once).
   */
  payload(id: number): Uint8Array {
    if (this.segments.length === 1) return this.payloadView(id);
    this.gathered ??= new Uint8Array(this.blockBytes);
    for (const g of this.segments) this.gathered.set(g.bytes.subarray(id * g.blockBytes, (id + 1) * g.blockBytes), g.payloadOffset);
    return this.gathered;
  }

  private payloadView(id: number): Uint8Array {
    const b = this.segments[0]!.bytes;
    return b.subarray(id * this.blockBytes, (id + 1) * this.blockBytes);
  }

  /**
   * CRC-32C of the block's payload when it is a named full block (its content can no
   * longer change), computed once and kept until the block is handed out again; null for
   * any other block, whose payload may still be written.
   */
  payloadCrc(id: number): number | null {
    if (this.hashes[id] === 0n || this.fills[id] !== this.shape.blockTokens) return null;
    if (this.crcValid[id] === 0) {
      this.crcs[id] = crc32c(this.payload(id));
      this.crcValid[id] = 1;
    }
    return this.crcs[id]!;
  }

  /**
   * Records whose payloads are views into the slab (writing the envelope is the one copy); a
   * pool split by layer gathers each into a copy of its own.
   */
  export(ids: readonly number[]): EnvelopeRecord[] {
    return ids.map((id) => {
      if (this.refs[id]! <= 0) assert.fail(`export of unreferenced block ${id}`);
      const payload = this.segments.length === 1 ? this.payloadView(id) : this.payload(id).slice();
      return { hash: this.hashes[id]!, nTokens: this.fills[id]!, payload };
    });
  }

  /**
   * Copies records into fresh blocks (refcount 1). A record with a hash is registered
   * unless another block already owns that hash. Null, with nothing taken, when short.
   */
  import(records: readonly EnvelopeRecord[]): number[] | null {
    const ids = this.allocate(records.length);
    if (ids === null) return null;
    for (let i = 0; i < records.length; i++) {
      const r = records[i]!;
      const id = ids[i]!;
      if (r.payload.length !== this.blockBytes) assert.fail(`payload ${r.payload.length} bytes, want ${this.blockBytes}`);
      for (const g of this.segments) g.bytes.set(r.payload.subarray(g.payloadOffset, g.payloadOffset + g.blockBytes), id * g.blockBytes);
      this.fills[id] = r.nTokens;
      if (r.hash !== 0n && !this.index.has(r.hash)) this.register(id, r.hash);
    }
    return ids;
  }

  private check(id: number): void {
    if (!(Number.isInteger(id) && id >= 0 && id < this.total)) assert.fail(`block id ${id} outside 0..${this.total - 1}`);
  }

  private pushLru(id: number): void {
    this.prev[id] = this.lruTail;
    this.next[id] = NONE;
    if (this.lruTail !== NONE) this.next[this.lruTail] = id;
    else this.lruHead = id;
    this.lruTail = id;
  }

  private unlink(id: number): void {
    const p = this.prev[id]!;
    const n = this.next[id]!;
    if (p !== NONE) this.next[p] = n;
    else this.lruHead = n;
    if (n !== NONE) this.prev[n] = p;
    else this.lruTail = p;
    this.prev[id] = NONE;
    this.next[id] = NONE;
  }
}

/** The one slab of a pool not split by layer: the caller's, or a fresh zeroed one. */
function oneSlab(slabBytes: number, opts: KvPoolOptions): { slab: ArrayBufferLike; slabOffset: number } {
  const slab = opts.slab ?? (opts.shared ? new SharedArrayBuffer(slabBytes) : new ArrayBuffer(slabBytes));
  return { slab, slabOffset: opts.slabOffset ?? 0 };
}

/**
 * The segments over `rooms`, checked: in layer order, every layer once, each 16-aligned inside
 * its buffer (`exact`: a pool given a slab without an offset takes all of it).
 */
function segmentsOf(
  shape: KvShape,
  numBlocks: number,
  rooms: readonly { slab: ArrayBufferLike; slabOffset: number; firstLayer: number; nLayers: number }[],
  exact: boolean,
): KvSegment[] {
  const layerBytes = blockPayloadBytes({ ...shape, nLayers: 1 });
  let next = 0;
  const segments = rooms.map((r) => {
    if (!(r.firstLayer === next && Number.isInteger(r.nLayers) && r.nLayers >= 1 && next + r.nLayers <= shape.nLayers)) {
      assert.fail(`segment of layers ${r.firstLayer}+${r.nLayers}: segments must take layers 0..${shape.nLayers - 1} in order, each once`);
    }
    next += r.nLayers;
    const blockBytes = r.nLayers * layerBytes;
    const bytes = numBlocks * blockBytes;
    const at = r.slabOffset;
    if (exact) {
      if (r.slab.byteLength !== bytes) assert.fail(`slab of ${r.slab.byteLength} bytes, want ${bytes} for ${numBlocks} blocks`);
    } else if (!(Number.isInteger(at) && at >= 0 && at % 16 === 0 && at + bytes <= r.slab.byteLength)) {
      assert.fail(`slab offset ${at}: ${bytes} bytes for ${numBlocks} blocks must fit 16-aligned in ${r.slab.byteLength}`);
    }
    const payloadOffset = r.firstLayer * layerBytes;
    return {
      firstLayer: r.firstLayer,
      nLayers: r.nLayers,
      blockBytes,
      blockElems: blockBytes / 2,
      payloadOffset,
      bytes: new Uint8Array(r.slab, at, bytes),
      data: new Float16Array(r.slab, at, bytes / 2),
    };
  });
  if (next !== shape.nLayers) assert.fail(`segments end at layer ${next}, the pool has ${shape.nLayers}`);
  return segments;
}
