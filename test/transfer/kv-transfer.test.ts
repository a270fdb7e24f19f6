import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { crc32c, readEnvelope, writeEnvelope } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { buildChunks, KvError, transfer, TransferError, type KvChunkLike, type KvTransport } from "../../src/transfer/index.ts";
import { startCuttingProxy } from "../support/cutting-proxy.ts";
import { fakePrefill, fakePrompt, kvDigest, patternDigest } from "../support/fake-model.ts";
import { dataPlaneOf, ENVELOPE_BYTES, evictAll, PATHS, prefillTransport, pushTo, SHAPE, settle, snapshot, startDecode, type Decode } from "./harness.ts";

async function refusal(p: Promise<unknown>): Promise<TransferError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(TransferError);
    return e as TransferError;
  }
  throw new Error("expected a refusal, the push was accepted");
}

/** Claims the handle on D and checks its blocks hold exactly what prefilling `tokens` writes. */
function claimAndCheck(d: Decode, handle: string, tokens: number[]): void {
  const h = d.rx.claim(handle);
  expect(h).not.toBeNull();
  expect(h!.nTokens).toBe(tokens.length);
  expect(h!.blockIds.length).toBe(Math.ceil(tokens.length / SHAPE.blockTokens));
  expect(kvDigest(d.pool, h!.blockIds, h!.nTokens)).toBe(patternDigest(SHAPE, tokens));
  d.pool.releaseAll(h!.blockIds);
}

/** Copies a chunk with a fresh envelope buffer (the built ones share one slab). */
function cloneChunk(c: KvChunkLike): KvChunkLike {
  return { ...c, envelope: c.envelope.slice() };
}

/** Rewrites an envelope's inner CRC and the chunk CRC after an edit. */
function reseal(c: KvChunkLike): void {
  const e = c.envelope;
  const crc = crc32c(e.subarray(0, e.length - 4));
  new DataView(e.buffer, e.byteOffset, e.length).setUint32(e.length - 4, crc, true);
  c.crc32c = crc32c(e);
}

for (const path of PATHS) {
  describe(path, () => {
    let d: Decode;
    let P: KvPool;
    let t: ReturnType<typeof prefillTransport>;
    let n = 0;
    const handle = () => `h-${path}-${++n}`;
    beforeAll(async () => {
      d = await startDecode(path);
      P = new KvPool(SHAPE, 64);
      t = prefillTransport(path);
    });
    afterAll(async () => {
      await t.close();
      await d.close();
    });

    test("has blocks takes no reference", async () => {
      const tokens = fakePrompt(12, 11);
      const pre = fakePrefill(d.pool, tokens)!;
      d.pool.releaseAll(pre.ids.slice(1)); // block 0 stays used, blocks 1, 2 cached
      const before = snapshot(d.pool, d.rx);
      const absent = fakePrompt(8, 12);
      const asked = [...pre.hashes, ...fakePrefill(new KvPool(SHAPE, 4), absent)!.hashes];
      expect(d.rx.hasBlocks(asked, 1)).toEqual([true, true, true, false, false]);
      expect((await t.hasBlocks(d.target, asked, 1)).present).toEqual([true, true, true, false, false]);
      // the path under test is the one pushes take
      expect(await dataPlaneOf(t, d.target)).toBe(path === "data-plane" ? d.server.dataPlaneAddress : undefined);
      expect(snapshot(d.pool, d.rx)).toEqual(before);
      for (const id of pre.ids) expect(d.pool.refCount(id)).toBe(id === pre.ids[0] ? 1 : 0);
      expect(() => d.rx.hasBlocks(asked, 2)).toThrow(KvError);
      expect((await refusal(t.hasBlocks(d.target, asked, 2))).code).toBe(Code.FailedPrecondition);
      expect(snapshot(d.pool, d.rx)).toEqual(before);
      d.pool.release(pre.ids[0]!);
      evictAll(d.pool);
    });

    test("push accepts dedups and refuses", async () => {
      const base = snapshot(d.pool, d.rx);
      // import: 2 full blocks + a tail of 1
      const tokens = fakePrompt(9, 21);
      let pre = fakePrefill(P, tokens)!;
      let h = handle();
      let st = await transfer(t, d.target, P, h, pre.ids, pre.hashes);
      expect(st).toEqual({ blocksSent: 3, blocksDeduped: 0, payloadBytes: 3 * ENVELOPE_BYTES, nTokens: 9 });
      claimAndCheck(d, h, tokens);
      // dedup: same two full blocks, another tail
      const tokens2 = [...tokens.slice(0, 8), 7, 8, 9];
      pre = fakePrefill(P, tokens2, { reusePrefix: true })!;
      h = handle();
      st = await transfer(t, d.target, P, h, pre.ids, pre.hashes);
      expect(st).toEqual({ blocksSent: 1, blocksDeduped: 2, payloadBytes: ENVELOPE_BYTES, nTokens: 11 });
      claimAndCheck(d, h, tokens2);
      evictAll(d.pool);
      evictAll(P);
      expect(snapshot(d.pool, d.rx)).toEqual(base);

      // refusals: D holds tokens' first block cached, then every bad push must leave it as it is
      const warm = fakePrefill(d.pool, tokens.slice(0, 4))!;
      d.pool.releaseAll(warm.ids);
      const before = snapshot(d.pool, d.rx);
      const big = fakePrompt(18, 22); // 4 full + tail of 2
      const src = fakePrefill(P, [...tokens.slice(0, 4), ...big.slice(4)])!;
      const hid = handle();
      const good = () => buildChunks(P, hid, src.ids, src.hashes, [true, false, false, false]).map(cloneChunk);
      const other = new KvPool({ ...SHAPE, headDim: 8 }, 8);
      const otherPre = fakePrefill(other, big)!;
      const wrongShape = buildChunks(other, hid, otherPre.ids, otherPre.hashes, [true, false, false, false]).map(cloneChunk);
      const twoBlocks = writeEnvelope({ version: 1, dtype: 1, nBlocks: 2, ...SHAPE }, P.export(src.ids.slice(1, 3)));
      const cases: [string, number, (c: KvChunkLike[]) => KvChunkLike[]][] = [
        ["bad chunk crc", Code.DataLoss, (c) => ((c[2]!.crc32c ^= 1), c)],
        ["corrupt envelope", Code.DataLoss, (c) => ((c[2]!.envelope[100]! ^= 0x40), (c[2]!.crc32c = crc32c(c[2]!.envelope)), c)],
        ["version 2", Code.FailedPrecondition, (c) => ((c[3]!.envelope[4] = 2), reseal(c[3]!), c)],
        ["wrong shape", Code.FailedPrecondition, (c) => [...c.slice(0, 3), ...wrongShape.slice(3)]],
        ["wrong kv_format", Code.FailedPrecondition, (c) => ((c[2]!.kvFormat = 2), c)],
        ["out-of-order index", Code.InvalidArgument, (c) => [c[0]!, c[1]!, c[3]!, c[2]!, c[4]!]],
        ["mismatched total", Code.InvalidArgument, (c) => ((c[2]!.total = 4), c)],
        ["mismatched handle", Code.InvalidArgument, (c) => ((c[2]!.handleId = "other"), c)],
        ["record hash disagrees", Code.DataLoss, (c) => ((c[2]!.hash ^= 1n), c)],
        ["two blocks in one envelope", Code.InvalidArgument, (c) => ((c[2]!.envelope = twoBlocks), (c[2]!.crc32c = crc32c(twoBlocks)), c)],
        ["ends early", Code.InvalidArgument, (c) => c.slice(0, 4)],
      ];
      for (const [name, code, edit] of cases) {
        const err = await refusal(pushTo(t, d.target, edit(good())));
        expect([name, err.code]).toEqual([name, code]);
        expect([name, snapshot(d.pool, d.rx)]).toEqual([name, before]);
      }
      expect(
        (
          await refusal(
            pushTo(
              t,
              d.target,
              good().map((c, i) => (i === 2 ? { ...c, crc32c: c.crc32c ^ 1 } : c)),
            ),
          )
        ).message,
      ).toMatch(/crc mismatch: got 0x[0-9a-f]{8}, want 0x[0-9a-f]{8}/);
      // evicted dedup block
      evictAll(d.pool);
      const evicted = snapshot(d.pool, d.rx);
      expect((await refusal(pushTo(t, d.target, good()))).code).toBe(Code.NotFound);
      expect(snapshot(d.pool, d.rx)).toEqual(evicted);
      // the same chunks, untouched, are accepted once D holds block 0 again
      const again = fakePrefill(d.pool, tokens.slice(0, 4))!;
      d.pool.releaseAll(again.ids);
      const ack = await pushTo(t, d.target, good());
      expect([ack.blocksReceived, ack.blocksDeduped, ack.nTokens]).toEqual([4, 1, 18]);
      claimAndCheck(d, hid, [...tokens.slice(0, 4), ...big.slice(4)]);
      P.releaseAll(src.ids);

      // an unregistered full block (P's pool has that hash on another block) is registered on arrival
      evictAll(d.pool);
      const first = fakePrefill(P, big)!;
      const dup = fakePrefill(P, big)!;
      expect(P.hashOf(dup.ids[1]!)).toBe(0n);
      const chunks = buildChunks(P, handle(), dup.ids, dup.hashes, [false, false, false, false]);
      expect(readEnvelope(chunks[1]!.envelope, SHAPE).records[0]!.hash).toBe(0n);
      expect(chunks[1]!.hash).toBe(dup.hashes[1]!);
      await pushTo(t, d.target, chunks);
      const held = d.rx.claim(chunks[0]!.handleId)!;
      expect(held.hashes).toEqual(dup.hashes);
      for (let i = 0; i < 4; i++) expect(d.pool.lookup(dup.hashes[i]!)).toBe(held.blockIds[i]!);
      expect(kvDigest(d.pool, held.blockIds, held.nTokens)).toBe(patternDigest(SHAPE, big));
      d.pool.releaseAll(held.blockIds);
      P.releaseAll(first.ids);
      P.releaseAll(dup.ids);
      evictAll(d.pool);
      evictAll(P);
    });

    test("release frees the handle", async () => {
      const base = snapshot(d.pool, d.rx);
      const tokens = fakePrompt(10, 31);
      const pre = fakePrefill(P, tokens)!;
      const h = handle();
      await transfer(t, d.target, P, h, pre.ids, pre.hashes);
      // P holds nothing after a push: its full blocks stay in its prefix cache
      expect(P.used).toBe(0);
      expect(P.cached).toBe(2);
      expect(d.rx.pending()).toBe(1);
      expect(d.pool.used).toBe(base.used + 3);
      expect(await t.release(d.target, h)).toBe(true);
      expect(await t.release(d.target, h)).toBe(false);
      expect(await t.release(d.target, "never-seen")).toBe(false);
      expect(d.rx.claim(h)).toBeNull();
      expect(snapshot(d.pool, d.rx)).toEqual({ ...base, cached: base.cached + 2, free: base.free - 2 });
      evictAll(d.pool);
      evictAll(P);

      // time to live: a clock the test moves, on a receiver of its own
      let now = 1_000;
      const dt = await startDecode(path, { rx: { ttlMs: 5_000, now: () => now } });
      try {
        const b0 = snapshot(dt.pool, dt.rx);
        const p2 = fakePrefill(P, tokens)!;
        await transfer(t, dt.target, P, "ttl", p2.ids, p2.hashes);
        now += 4_999;
        expect(dt.rx.pending()).toBe(1);
        now += 2;
        expect(dt.rx.pending()).toBe(0);
        expect(dt.rx.claim("ttl")).toBeNull();
        expect(dt.pool.used).toBe(b0.used);
      } finally {
        await dt.close();
      }
      // and the unref'd timer frees handles nobody asks about
      const dr = await startDecode(path, { rx: { ttlMs: 20 } });
      try {
        const p3 = fakePrefill(P, tokens)!;
        await transfer(t, dr.target, P, "ttl-timer", p3.ids, p3.hashes);
        expect(dr.pool.used).toBe(3);
        expect(await settle(() => dr.pool.used === 0)).toBe(true);
        expect(dr.rx.claim("ttl-timer")).toBeNull();
      } finally {
        await dr.close();
      }
      evictAll(P);
    });

    test("bytes moved are missing blocks plus tail", async () => {
      const tokens = fakePrompt(9, 41); // F = 2, t = 1
      const warmUp = async (k: number) => {
        evictAll(d.pool);
        if (k > 0) {
          const w = fakePrefill(d.pool, tokens.slice(0, k * 4))!;
          d.pool.releaseAll(w.ids);
        }
      };
      for (const [k, prompt] of [
        [0, tokens],
        [1, tokens],
        [2, tokens],
        [2, tokens.slice(0, 8)],
      ] as const) {
        await warmUp(k);
        const F = Math.floor(prompt.length / 4);
        const tail = prompt.length % 4 === 0 ? 0 : 1;
        const pre = fakePrefill(P, [...prompt])!;
        const h = handle();
        const st = await transfer(t, d.target, P, h, pre.ids, pre.hashes);
        expect({ k, ...st }).toEqual({
          k,
          blocksSent: F - k + tail,
          blocksDeduped: k,
          payloadBytes: (F - k + tail) * (28 + 12 + 128 + 4),
          nTokens: prompt.length,
        });
        claimAndCheck(d, h, [...prompt]);
        evictAll(P);
      }
      evictAll(d.pool);
    });

    test("transfer reset frees both sides", async () => {
      // The proxy sits on whichever connection carries the push: gRPC, or the data plane D advertises.
      let dataPlane = "";
      const proxy = await startCuttingProxy(() => (path === "grpc" ? dc.target : dataPlane), { cutAfterBytes: 3_000, maxCuts: 1 });
      const dc: Decode = await startDecode(path, path === "grpc" ? {} : { advertiseDataPlane: proxy.address });
      dataPlane = dc.server.dataPlaneAddress;
      const via = path === "grpc" ? proxy.address : dc.target;
      const tp = prefillTransport(path);
      try {
        const baseD = snapshot(dc.pool, dc.rx);
        const baseP = snapshot(P);
        const tokens = fakePrompt(4 * 40 + 3, 51); // 41 envelopes of 172 bytes: ~7 KB, cut at 3 KB
        const pre = fakePrefill(P, tokens)!;
        if (path === "data-plane") {
          // The data plane broke under the push: D freed what it took, and the same push went over gRPC.
          const st = await transfer(tp, via, P, "cut", pre.ids, pre.hashes);
          expect([proxy.cuts(), tp.dataPlaneFallbacks, st.nTokens]).toEqual([1, 1, tokens.length]);
          expect(P.used).toBe(baseP.used);
          claimAndCheck(dc, "cut", tokens);
          evictAll(P);
          evictAll(dc.pool);
        } else {
          const err = await refusal(transfer(tp, via, P, "cut", pre.ids, pre.hashes));
          expect(proxy.cuts()).toBe(1);
          expect<number[]>([Code.Unavailable, Code.Internal, Code.Canceled, Code.Aborted, Code.Unknown]).toContain(err.code);
          // P dropped its references before the error reached us
          expect(P.used).toBe(baseP.used);
        }
        expect(await settle(() => dc.rx.inFlight() === 0 && dc.pool.used === baseD.used)).toBe(true);
        expect(snapshot(dc.pool, dc.rx)).toEqual(baseD);
        // both keep serving: the same P transport, straight to D (and D to anyone)
        const again = fakePrefill(P, tokens, { reusePrefix: true })!;
        const st = await transfer(tp, dc.target, P, "after-cut", again.ids, again.hashes);
        expect(st.nTokens).toBe(tokens.length);
        claimAndCheck(dc, "after-cut", tokens);
        expect(P.used).toBe(0);
      } finally {
        await tp.close();
        await proxy.close();
        await dc.close();
        evictAll(P);
      }
    });

    test("abandoned push frees decode blocks", async () => {
      const tokens = fakePrompt(40, 61); // 10 full blocks
      const pre = fakePrefill(P, tokens)!;
      const chunks = buildChunks(P, "abandoned", pre.ids, pre.hashes, new Array(10).fill(false));
      const base = snapshot(d.pool, d.rx);
      // the client gives up after 5 of 10 chunks, once D has taken them: an abort, a broken producer, and a short clean end
      for (const how of ["abort", "throw", "end"] as const) {
        const ac = new AbortController();
        async function* five() {
          for (let i = 0; i < 5; i++) yield chunks[i]!;
          await settle(() => d.pool.used === base.used + 5);
          if (how === "abort") {
            ac.abort();
            await Bun.sleep(20);
          }
          if (how === "throw") throw new Error("prefill engine gave up");
        }
        const p = how === "abort" ? pushTo(t, d.target, five(), { signal: ac.signal }) : pushTo(t, d.target, five());
        await p.then(
          () => {
            throw new Error(`${how}: push accepted`);
          },
          () => {},
        );
        expect([how, await settle(() => d.rx.inFlight() === 0 && d.pool.used === base.used)]).toEqual([how, true]);
        expect([how, snapshot(d.pool, d.rx)]).toEqual([how, base]);
      }
      P.releaseAll(pre.ids);
      evictAll(P);
    });

    test("evicted block is resent", async () => {
      const tokens = fakePrompt(22, 71); // 5 full + tail of 2
      const w = fakePrefill(d.pool, tokens.slice(0, 12))!;
      d.pool.releaseAll(w.ids);
      const pushes: number[] = [];
      // D evicts its cache between HasBlocks and PushKv
      const racing: KvTransport = {
        hasBlocks: async (target, hashes, fmt) => {
          const present = await t.hasBlocks(target, hashes, fmt);
          evictAll(d.pool);
          return present;
        },
        push: async (target, chunks) => {
          const list = chunks as KvChunkLike[];
          pushes.push(list.filter((c) => c.envelope.length > 0).length);
          return t.push(target, chunks);
        },
        close: () => t.close(),
      };
      const base = snapshot(d.pool, d.rx);
      const pre = fakePrefill(P, tokens)!;
      const st = await transfer(racing, d.target, P, "evicted", pre.ids, pre.hashes);
      expect(pushes).toEqual([3, 6]);
      expect(st).toEqual({ blocksSent: 6, blocksDeduped: 0, payloadBytes: 6 * ENVELOPE_BYTES, nTokens: 22 });
      expect(P.used).toBe(0);
      expect(d.rx.pending()).toBe(base.pending + 1);
      claimAndCheck(d, "evicted", tokens);
      evictAll(P);
      evictAll(d.pool);
    });
  });
}
