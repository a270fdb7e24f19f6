// The KvCacheManager on its own: every block a table, a step in flight or a caller holds is one
// pool reference, whatever order tables are grown, named, hit, freed, handed off and held in.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { type BlockHold, KvCacheManager, type KvBlocks } from "../../src/engine/kv-cache-manager.ts";
import { KvPool } from "../../src/pool/index.ts";

const shape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };
const B = shape.blockTokens;

/** Chained hashes of a prompt family's blocks: tables of one family share their prefix. */
const hashesOf = (family: number, n: number) => Array.from({ length: n }, (_, i) => BigInt(family * 1000 + i + 1));

interface Table {
  kv: KvBlocks;
  family: number;
  /** The newest step in flight holding it (index into steps), or -1. */
  holder: number;
}

interface Held extends BlockHold {
  /** What the model says waits on this step: given back while it was in flight. */
  readonly waits: number[];
}

describe("KvCacheManager", () => {
  test("every reference is a table's, a step's in flight or a caller's, under random operations", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(9), fc.nat(40)), { maxLength: 250 }), (ops) => {
        const pool = new KvPool(shape, 12);
        const kv = new KvCacheManager(pool);
        const tables: Table[] = [];
        const handed: number[][] = [];
        const steps: Held[] = [];
        let settled = 0;
        const pick = <T>(xs: T[], n: number): T | undefined => (xs.length === 0 ? undefined : xs[n % xs.length]);
        for (const [op, arg] of ops) {
          const t = pick(tables, arg);
          if (op === 0) {
            const kvb = kv.open();
            const family = arg % 3;
            // A fresh table starts with the cached blocks of its family's prefix.
            const hits = kv.takePrefixHits(kvb, hashesOf(family, 8), arg % 5);
            expect(hits).toBeLessThanOrEqual(arg % 5);
            for (let i = 0; i < hits; i++) expect(pool.hashOf(kvb.ids[i]!)).toBe(hashesOf(family, 8)[i]!);
            tables.push({ kv: kvb, family, holder: -1 });
          } else if (op === 1 && t) {
            const want = t.kv.count + (arg % 3) + 1;
            const before = [...t.kv.ids];
            const got = kv.allocate(t.kv, want * B);
            if (got === null) expect([...t.kv.ids]).toEqual(before);
            else expect(t.kv.count).toBe(want);
          } else if (op === 2 && t && t.kv.count > 0) {
            // Computed up to some position of its table: full blocks get their family's names,
            // unless another live block has the name already (a table of the same family, or
            // one handed off): the pool names one block per hash, and this one stays unnamed.
            const to = Math.min(t.kv.count * B, (arg % (t.kv.count * B)) + 1);
            const hashes = hashesOf(t.family, t.kv.count);
            kv.markComputed(t.kv, hashes, 0, to);
            for (let i = 0; i < Math.floor(to / B); i++) {
              const id = t.kv.ids[i]!;
              const owner = pool.lookup(hashes[i]!);
              expect(pool.hashOf(id) === hashes[i]! ? owner === id : pool.hashOf(id) === 0n && owner >= 0 && owner !== id).toBe(true);
            }
          } else if (op === 3 && t) {
            const ids = [...t.kv.ids];
            kv.free(t.kv);
            expect(t.kv.count).toBe(0);
            if (t.holder >= 0) steps[t.holder]!.waits.push(...ids);
          } else if (op === 4 && t) {
            // A prefill hands its prompt off once every position of it is computed.
            const promptLen = arg % (t.kv.count * B + 1);
            kv.markComputed(t.kv, hashesOf(t.family, t.kv.count), 0, promptLen);
            const ids = [...t.kv.ids];
            const out = kv.handOff(t.kv, promptLen);
            const n = Math.ceil(promptLen / B);
            expect(out).toEqual(ids.slice(0, n));
            handed.push(out);
            if (t.holder >= 0) steps[t.holder]!.waits.push(...ids.slice(n));
          } else if (op === 5 && handed.length > 0) {
            const [ids] = handed.splice(arg % handed.length, 1);
            pool.releaseAll(ids!);
          } else if (op === 6 && handed.length > 0) {
            const ids = handed[arg % handed.length]!;
            const share = kv.sharePrompt(ids, Math.max(0, ids.length * B - (arg % 2)));
            if (share !== null) handed.push(share);
          } else if (op === 7 && tables.length > 0) {
            // A step in flight over a few tables.
            const step: Held = { deferred: [], waits: [] };
            steps.push(step);
            for (let i = 0; i <= arg % 3; i++) {
              const row = tables[(arg + i) % tables.length]!;
              kv.hold(row.kv, step);
              row.holder = steps.length - 1;
            }
          } else if (op === 8 && settled < steps.length) {
            // The oldest step in flight settles (they settle in the order posted).
            const s = settled++;
            const step = steps[s]!;
            for (const row of tables) {
              kv.unhold(row.kv, step);
              if (row.holder === s) row.holder = -1;
            }
            kv.settle(step);
            expect(step.deferred).toEqual([]);
            step.waits.length = 0;
          } else if (op === 9 && t && t.holder < 0) {
            kv.free(t.kv);
            tables.splice(tables.indexOf(t), 1);
          }
          expect(pool.used + pool.cached + pool.free).toBe(pool.total);
          const refs = new Map<number, number>();
          const count = (ids: readonly number[]) => {
            for (const id of ids) refs.set(id, (refs.get(id) ?? 0) + 1);
          };
          for (const row of tables) count(row.kv.ids);
          for (const ids of handed) count(ids);
          for (const step of steps) count(step.waits);
          for (let id = 0; id < pool.total; id++) expect(pool.refCount(id)).toBe(refs.get(id) ?? 0);
        }
      }),
      // The first: a table handed off and grown again names a block whose hash its handed-off
      // block still owns (a run of CI found it; the check above once asked for a name there).
      {
        numRuns: 300,
        examples: [
          [
            [
              [0, 0],
              [1, 0],
              [4, 11],
              [1, 0],
              [2, 13],
            ],
          ],
        ],
      },
    );
  });

  test("a block is named only once every one of its positions is computed", () => {
    const pool = new KvPool(shape, 4);
    const kv = new KvCacheManager(pool);
    const b = kv.allocate(kv.open(), 5)!;
    kv.markComputed(b, hashesOf(0, 2), 0, 3);
    expect(b.ids.map((id) => pool.hashOf(id))).toEqual([1n, 0n, 0n]);
    expect(b.ids.map((id) => pool.fillOf(id))).toEqual([2, 1, 0]);
    kv.markComputed(b, hashesOf(0, 2), 3, 5);
    expect(b.ids.map((id) => pool.hashOf(id))).toEqual([1n, 2n, 0n]);
    expect(b.ids.map((id) => pool.fillOf(id))).toEqual([2, 2, 1]);
  });

  test("a table's blocks stay referenced while a step holding it is in flight, and go back when the newest settles", () => {
    const pool = new KvPool(shape, 4);
    const kv = new KvCacheManager(pool);
    const b = kv.allocate(kv.open(), 4)!;
    const first: BlockHold = { deferred: [] };
    const second: BlockHold = { deferred: [] };
    kv.hold(b, first);
    kv.hold(b, second);
    kv.unhold(b, first);
    kv.settle(first);
    // Freed after the older step settled: the newer one still runs over these blocks.
    kv.free(b);
    expect(pool.used).toBe(2);
    kv.unhold(b, second);
    kv.settle(second);
    expect(pool.used).toBe(0);
  });

  test("tables are the manager's: one made elsewhere is refused", () => {
    const kv = new KvCacheManager(new KvPool(shape, 4));
    const forged = { ids: [0], count: 1, held: false } as unknown as KvBlocks;
    expect(() => kv.allocate(forged, 4)).toThrow(/not made by a KvCacheManager/);
  });
});
