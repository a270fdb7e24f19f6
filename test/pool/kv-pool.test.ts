import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { crc32c } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";

const shape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };

function addsUp(p: KvPool): void {
  expect(p.used + p.cached + p.free).toBe(p.total);
}

describe("KvPool", () => {
  test("refcounts: acquire and release move blocks between used, cached and free", () => {
    const p = new KvPool(shape, 4);
    const [a, b] = p.allocate(2)!;
    expect([p.used, p.cached, p.free]).toEqual([2, 0, 2]);
    p.register(a!, 11n);
    p.acquire(a!);
    expect(p.refCount(a!)).toBe(2);
    p.release(a!);
    expect(p.used).toBe(2);
    p.release(a!);
    p.release(b!);
    expect([p.used, p.cached, p.free]).toEqual([0, 1, 3]);
    p.acquire(a!); // a prefix hit revives a cached block
    expect([p.used, p.cached, p.free]).toEqual([1, 0, 3]);
    addsUp(p);
    expect(() => p.release(b!)).toThrow(/refcount 0/);
    expect(() => p.acquire(b!)).toThrow(/free block/);
  });

  test("lookup takes no reference and does not change eviction order", () => {
    const p = new KvPool(shape, 3);
    const ids = p.allocate(3)!;
    ids.forEach((id, i) => p.register(id, BigInt(100 + i)));
    p.releaseAll(ids); // LRU: 100, 101, 102
    for (let i = 0; i < 5; i++) expect(p.lookup(100n)).toBe(ids[0]!);
    expect([p.used, p.cached]).toEqual([0, 3]);
    const [x] = p.allocate(1)!;
    expect(x).toBe(ids[0]!); // still evicted first despite the lookups
    expect(p.lookup(100n)).toBe(-1);
    expect(p.lookup(101n)).toBe(ids[1]!);
  });

  test("eviction order: free blocks first, then cached least recently released", () => {
    const p = new KvPool(shape, 4);
    const ids = p.allocate(4)!;
    p.register(ids[0]!, 1n);
    p.register(ids[1]!, 2n);
    p.register(ids[2]!, 3n);
    // release order 2, 0, 1; ids[3] has no hash and becomes free
    p.release(ids[2]!);
    p.release(ids[0]!);
    p.release(ids[1]!);
    p.release(ids[3]!);
    expect([p.cached, p.free]).toEqual([3, 1]);
    expect(p.allocate(1)).toEqual([ids[3]!]);
    expect(p.allocate(1)).toEqual([ids[2]!]);
    expect(p.allocate(1)).toEqual([ids[0]!]);
    expect(p.lookup(3n)).toBe(-1);
    expect(p.lookup(1n)).toBe(-1);
    expect(p.lookup(2n)).toBe(ids[1]!);
    addsUp(p);
  });

  test("exhaustion returns null and takes nothing", () => {
    const p = new KvPool(shape, 3);
    const a = p.allocate(2)!;
    expect(p.allocate(2)).toBeNull();
    expect([p.used, p.free]).toEqual([2, 1]);
    p.releaseAll(a);
    expect(p.allocate(4)).toBeNull();
    expect(p.import(new Array(4).fill({ hash: 0n, nTokens: 1, payload: new Uint8Array(p.blockBytes) }))).toBeNull();
    expect([p.used, p.cached, p.free]).toEqual([0, 0, 3]);
  });

  test("register refuses a hash another block owns", () => {
    const p = new KvPool(shape, 2);
    const [a, b] = p.allocate(2)!;
    expect(p.register(a!, 5n)).toBe(true);
    expect(p.register(b!, 5n)).toBe(false);
    expect(p.hashOf(b!)).toBe(0n);
    expect(p.register(a!, 5n)).toBe(true); // idempotent
    expect(p.register(a!, 6n)).toBe(false); // a block owns one hash
  });

  test("export/import round trip through the v1 layout", () => {
    const s = { blockTokens: 4, nLayers: 2, nKvHeads: 2, headDim: 3 };
    const src = new KvPool(s, 3);
    const dst = new KvPool(s, 5);
    const ids = src.allocate(2)!;
    for (const id of ids) {
      for (let l = 0; l < 2; l++)
        for (let kv = 0 as 0 | 1; kv <= 1; kv = (kv + 1) as 0 | 1) {
          for (let slot = 0; slot < 3; slot++)
            for (let h = 0; h < 2; h++)
              for (let d = 0; d < 3; d++) src.data[src.offset(id, l, kv, slot, h) + d] = id + l * 0.5 + kv * 0.25 + slot + h * 8 + d / 4;
          if (kv === 1) break;
        }
      src.setFill(id, id === ids[0] ? 4 : 3);
    }
    src.register(ids[0]!, 42n);
    const recs = src.export(ids);
    expect(recs.map((r) => [r.hash, r.nTokens])).toEqual([
      [42n, 4],
      [0n, 3],
    ]);
    dst.allocate(1); // so ids differ between pools
    const got = dst.import(recs)!;
    expect(got).toEqual([1, 2]);
    for (let i = 0; i < 2; i++) {
      expect(dst.payload(got[i]!)).toEqual(src.payload(ids[i]!));
      expect(dst.fillOf(got[i]!)).toBe(src.fillOf(ids[i]!));
    }
    expect(dst.lookup(42n)).toBe(got[0]!);
    // layout: slot past the fill reads as zero, and the offset formula is the spec's
    expect(src.data[src.offset(ids[1]!, 1, 1, 3, 1) + 2]).toBe(0);
    expect(src.offset(ids[1]!, 1, 1, 2, 1)).toBe(ids[1]! * src.blockElems + ((1 * 2 + 1) * 4 + 2) * 6 + 3);
  });

  test("pool payload crc cached for named full blocks", () => {
    const p = new KvPool(shape, 1);
    const [a] = p.allocate(1)!;
    p.data.fill(3, a! * p.blockElems, (a! + 1) * p.blockElems);
    p.setFill(a!, 1);
    expect(p.payloadCrc(a!)).toBeNull(); // partial: still being written
    p.setFill(a!, 2);
    expect(p.payloadCrc(a!)).toBeNull(); // full but unnamed
    p.register(a!, 7n);
    const first = crc32c(p.payload(a!));
    expect(p.payloadCrc(a!)).toBe(first);
    // Cached: a write the invariant forbids would not be seen, which is how we know it is kept.
    p.data[a! * p.blockElems] = 1;
    expect(p.payloadCrc(a!)).toBe(first);
    // Evicted and handed out again: the cache goes with the name.
    p.release(a!);
    const [b] = p.allocate(1)!;
    expect(b).toBe(a!);
    p.data.fill(5, b! * p.blockElems, (b! + 1) * p.blockElems);
    p.setFill(b!, 2);
    p.register(b!, 8n);
    expect(p.payloadCrc(b!)).toBe(crc32c(p.payload(b!)));
    expect(p.payloadCrc(b!)).not.toBe(first);
    // importBlock takes a fresh block too.
    p.release(b!);
    const payload = new Uint8Array(p.blockBytes).fill(9);
    const c = p.importBlock(payload, 2);
    expect(c).toBe(a!);
    p.register(c, 9n);
    expect(p.payloadCrc(c)).toBe(crc32c(payload));
  });

  test("a reused block comes back zeroed with fill 0", () => {
    const p = new KvPool(shape, 1);
    const [a] = p.allocate(1)!;
    p.data.fill(3, a! * p.blockElems, (a! + 1) * p.blockElems);
    p.setFill(a!, 2);
    p.release(a!);
    const [b] = p.allocate(1)!;
    expect(b).toBe(a!);
    expect(p.fillOf(b!)).toBe(0);
    expect([...p.payload(b!)].every((x) => x === 0)).toBe(true);
  });

  test("counters always add up under random operations", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(3), fc.nat(20)), { maxLength: 200 }), (ops) => {
        const p = new KvPool(shape, 8);
        const held: number[] = [];
        const refs = new Map<number, number>();
        for (const [op, arg] of ops) {
          if (op === 0) {
            const got = p.allocate((arg % 3) + 1);
            if (got === null) expect((arg % 3) + 1).toBeGreaterThan(p.free + p.cached);
            for (const id of got ?? []) {
              held.push(id);
              refs.set(id, 1);
            }
          } else if (op === 1 && held.length > 0) {
            const [id] = held.splice(arg % held.length, 1);
            p.release(id!);
            refs.set(id!, refs.get(id!)! - 1);
          } else if (op === 2 && held.length > 0) {
            p.register(held[arg % held.length]!, BigInt(arg + 1));
          } else if (op === 3) {
            const id = p.lookup(BigInt(arg + 1));
            if (id >= 0) {
              p.acquire(id);
              held.push(id);
              refs.set(id, (refs.get(id) ?? 0) + 1);
            }
          }
          addsUp(p);
          expect(p.used).toBe(new Set(held).size);
          for (const [id, n] of refs) expect(p.refCount(id)).toBe(n);
        }
      }),
      { numRuns: 300 },
    );
  });

  test("a shared slab: two pools over one SharedArrayBuffer see each other's bytes, bookkeeping apart", () => {
    const a = new KvPool(shape, 3, { shared: true });
    expect(a.slab).toBeInstanceOf(SharedArrayBuffer);
    const b = new KvPool(shape, 3, { slab: a.slab as SharedArrayBuffer });
    const [id] = a.allocate(1)!;
    b.data[b.offset(id!, 0, 1, 0, 0)] = 1.5;
    expect(a.data[a.offset(id!, 0, 1, 0, 0)]).toBe(1.5);
    expect(b.used).toBe(0);
    expect(() => new KvPool(shape, 4, { slab: a.slab as SharedArrayBuffer })).toThrow(/slab of \d+ bytes, want \d+ for 4 blocks/);
    expect(new KvPool(shape, 1).slab).toBeInstanceOf(ArrayBuffer);
  });

  test("a slab inside a bigger shared buffer: the pool's bytes start at slabOffset, its neighbours untouched", () => {
    const one = new KvPool(shape, 1).blockBytes;
    const buf = new SharedArrayBuffer(64 + 3 * one + 64);
    const outside = new Uint8Array(buf);
    outside.fill(7);
    const p = new KvPool(shape, 3, { slab: buf, slabOffset: 64 });
    expect([p.slab, p.slabOffset, p.bytes.byteLength]).toEqual([buf, 64, 3 * one]);
    const ids = p.allocate(3)!;
    p.data[p.offset(ids[2]!, 0, 1, 1, 0)] = 1.5;
    // Handed-out blocks are zeroed, and only they: the bytes around the slab keep their 7s.
    expect(outside[63]).toBe(7);
    expect(outside[64 + 3 * one]).toBe(7);
    expect(p.payload(ids[0]!).every((b) => b === 0)).toBe(true);
    expect(new KvPool(shape, 3, { slab: buf, slabOffset: 64 }).data[p.offset(ids[2]!, 0, 1, 1, 0)]).toBe(1.5);
    expect(() => new KvPool(shape, 3, { slab: buf, slabOffset: 65 })).toThrow(/slab offset 65: \d+ bytes for 3 blocks must fit 16-aligned in \d+/);
    expect(() => new KvPool(shape, 3, { slab: buf, slabOffset: 144 })).toThrow(/slab offset 144/);
  });

  describe("split by layer", () => {
    // Three layers, B = 2, H = 1, D = 4: a layer's share of a block is 2 * 2 * 4 * 2 = 32 bytes.
    const wide = { blockTokens: 2, nLayers: 3, nKvHeads: 1, headDim: 4 };
    const N = 6;
    const LAYER = 32;

    /** Layer 0 in one buffer at 16, layers 1..2 in another at 48, each among bytes of 9. */
    function split(): { pool: KvPool; bufs: Uint8Array[] } {
      const a = new SharedArrayBuffer(16 + N * LAYER + 16);
      const b = new SharedArrayBuffer(48 + N * 2 * LAYER + 16);
      const bufs = [new Uint8Array(a).fill(9), new Uint8Array(b).fill(9)];
      const pool = new KvPool(wide, N, {
        segments: [
          { slab: a, slabOffset: 16, firstLayer: 0, nLayers: 1 },
          { slab: b, slabOffset: 48, firstLayer: 1, nLayers: 2 },
        ],
      });
      return { pool, bufs };
    }

    test("holds what a pool in one piece holds under random writes, imports and reuse", () => {
      fc.assert(
        fc.property(fc.array(fc.tuple(fc.nat(4), fc.nat(1000), fc.nat(255)), { maxLength: 120 }), (ops) => {
          const one = new KvPool(wide, N);
          const { pool: two, bufs } = split();
          const held: number[] = [];
          for (const [op, arg, v] of ops) {
            if (op === 0) {
              const a = one.allocate(1);
              const b = two.allocate(1);
              expect(b).toEqual(a);
              if (a) held.push(a[0]!);
            } else if (op === 1 && held.length > 0) {
              // A K/V element of some layer, written where offset says: the model's store.
              const id = held[arg % held.length]!;
              const l = arg % 3;
              const slot = (arg >> 2) % 2;
              const kv = ((arg >> 3) % 2) as 0 | 1;
              one.data[one.offset(id, l, kv, slot, 0) + (v % 4)] = v;
              two.segmentOf(l).data[two.offset(id, l, kv, slot, 0) + (v % 4)] = v;
              one.setFill(id, slot + 1);
              two.setFill(id, slot + 1);
            } else if (op === 2) {
              // An import whose payload has junk past its fill: both zero it.
              const payload = new Uint8Array(one.blockBytes).map((_, i) => (i * 7 + v) & 255);
              const fill = (arg % 2) + 1;
              const a = one.importBlock(payload, fill);
              expect(two.importBlock(payload, fill)).toBe(a);
              if (a >= 0) held.push(a);
            } else if (op === 3 && held.length > 0) {
              const [id] = held.splice(arg % held.length, 1);
              one.release(id!);
              two.release(id!);
            } else if (op === 4 && held.length > 0) {
              const id = held[arg % held.length]!;
              one.register(id, BigInt(v + 1));
              two.register(id, BigInt(v + 1));
              one.setFill(id, 2);
              two.setFill(id, 2);
              // A copy-on-write tail: a block imported from the pool's own payload.
              const a = one.importBlock(one.payload(id), 2);
              expect(two.importBlock(two.payload(id), 2)).toBe(a);
              if (a >= 0) held.push(a);
            }
            for (const id of held) {
              expect(two.payload(id)).toEqual(one.payload(id));
              expect(two.payloadCrc(id)).toBe(one.payloadCrc(id));
            }
            expect(two.export(held)).toEqual(one.export(held));
          }
          // Nothing outside the segments was written.
          expect(bufs[0]!.subarray(0, 16).every((x) => x === 9) && bufs[0]!.subarray(16 + N * LAYER).every((x) => x === 9)).toBe(true);
          expect(bufs[1]!.subarray(0, 48).every((x) => x === 9) && bufs[1]!.subarray(48 + N * 2 * LAYER).every((x) => x === 9)).toBe(true);
        }),
        { numRuns: 200 },
      );
    });

    test("import lays each record's layers into their segments; export gathers them back", () => {
      const { pool } = split();
      const payload = new Uint8Array(pool.blockBytes).map((_, i) => i & 255);
      const [id] = pool.import([{ hash: 5n, nTokens: 2, payload }])!;
      expect(pool.segments.map((g) => [g.firstLayer, g.nLayers, g.blockBytes, g.payloadOffset])).toEqual([
        [0, 1, LAYER, 0],
        [1, 2, 2 * LAYER, LAYER],
      ]);
      expect(pool.segments[0]!.bytes.subarray(id! * LAYER, (id! + 1) * LAYER)).toEqual(payload.subarray(0, LAYER));
      expect(pool.segments[1]!.bytes.subarray(id! * 2 * LAYER, (id! + 1) * 2 * LAYER)).toEqual(payload.subarray(LAYER));
      const [rec] = pool.export([id!]);
      expect(rec!.payload).toEqual(payload);
      // Each record its own copy: a second export does not change the first.
      pool.segments[0]!.bytes[id! * LAYER] = 200;
      expect(rec!.payload[0]).toBe(0);
      expect(pool.lookup(5n)).toBe(id!);
    });

    test("segments must take every layer once, in order, and fit", () => {
      const a = new SharedArrayBuffer(4096);
      const room = (firstLayer: number, nLayers: number, slabOffset = 0) => ({ slab: a, slabOffset, firstLayer, nLayers });
      expect(() => new KvPool(wide, N, { segments: [room(0, 1), room(2, 1, 1024)] })).toThrow(/segments must take layers 0..2 in order, each once/);
      expect(() => new KvPool(wide, N, { segments: [room(0, 2), room(1, 2, 1024)] })).toThrow(/in order, each once/);
      expect(() => new KvPool(wide, N, { segments: [room(0, 2)] })).toThrow(/segments end at layer 2, the pool has 3/);
      expect(() => new KvPool(wide, N, { segments: [room(0, 1, 8), room(1, 2, 1024)] })).toThrow(/slab offset 8/);
      expect(() => new KvPool(wide, N, { segments: [room(0, 1), room(1, 2, 4000)] })).toThrow(/slab offset 4000/);
      const { pool } = split();
      expect(() => pool.bytes).toThrow(/split into 2 segments by layer has no one view/);
      expect(() => pool.segmentOf(3)).toThrow(/layer 3 outside 0..2/);
    });
  });
});
