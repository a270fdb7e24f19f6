import { expect, test } from "bun:test";
import fc from "fast-check";
import { KvEventLog, KvPool } from "../../src/pool/index.ts";

const shape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };

test("replaying a pool's events gives exactly the hashes it names, whatever it did", () => {
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.integer({ min: 1, max: 6 }), fc.boolean()), { maxLength: 60 }), (ops) => {
      const pool = new KvPool(shape, 8);
      const log = new KvEventLog(4096);
      pool.watch(log);
      let next = 1n;
      const held: number[][] = [];
      for (const [n, keep] of ops) {
        const ids = pool.allocate(Math.min(n, pool.available));
        if (ids === null) continue;
        for (const id of ids) pool.register(id, next++);
        if (keep && held.length < 2) held.push(ids);
        else pool.releaseAll(ids);
        if (held.length === 2 && !keep) pool.releaseAll(held.shift()!);
      }
      const s = log.read(1n, 1 << 20)!;
      const named = new Set<bigint>();
      for (let i = 0; i < s.hashes.length; i++) {
        if (s.removed[i]) expect(named.delete(s.hashes[i]!)).toBe(true);
        else named.add(s.hashes[i]!);
      }
      expect([...named].sort()).toEqual(pool.namedHashes().sort());
    }),
  );
});

test("the ring keeps the last `capacity` events; a cursor older than that reads null (take a snapshot)", () => {
  const log = new KvEventLog(4, 9n);
  for (let h = 1n; h <= 6n; h++) log.stored(h);
  log.removed(1n);
  expect([log.oldestSeq, log.nextSeq]).toEqual([4n, 8n]);
  expect(log.read(3n, 10)).toBeNull();
  const s = log.read(5n, 2)!;
  expect([s.firstSeq, [...s.hashes], [...s.removed]]).toEqual([5n, [5n, 6n], [0, 0]]);
  expect([...log.read(7n, 10)!.removed]).toEqual([1]);
  expect(log.read(9n, 10)!.hashes.length).toBe(0);
});
