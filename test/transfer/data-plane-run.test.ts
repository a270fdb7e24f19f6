// The data plane's RUN frame (data-plane-frame.ts): full pool blocks as entries, then
// their payloads, either straight from P's pool or copied through the client's stage;
// and D's side of it, which must refuse, free and reassemble exactly as for CHUNK frames.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { crc32c, envelopeBytes, promptHashes, type KvShape } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { PoolChunk, poolChunks, transfer } from "../../src/transfer/index.ts";
import {
  encodeEnd,
  encodeRunHead,
  FRAME_HEAD,
  FRAME_RUN,
  MAX_RUN,
  RUN_ENTRY,
  RUN_ENTRY_HEAD,
  RUN_FIXED,
  runFrameBytes,
} from "../../src/transfer/wire/index.ts";
import { ENVELOPE_HEAD_BYTES, getU16, getU32, getU64, putU32, putU64 } from "../../src/codec/index.ts";
import { concat, rawConnect, writeAll, type RawConn } from "../support/raw-data-plane.ts";
import { dataPlaneOf, evictAll, prefillTransport, settle, snapshot, startDecode, type Decode } from "./harness.ts";

// Payloads of 32 KiB: a prompt of 40 full blocks is well past the client's direct threshold.
const SHAPE: KvShape = { blockTokens: 16, nLayers: 4, nKvHeads: 4, headDim: 32 };
const B = SHAPE.blockTokens;
const E = envelopeBytes(SHAPE, 1);
/** data-plane-client.ts DIRECT_BYTES: adjacent blocks from this many bytes on go from the pool to the socket. */
const DIRECT_BYTES = 256 * 1024;
const SLOT_BYTES = SHAPE.nKvHeads * SHAPE.headDim * 2;
const SECTION_BYTES = B * SLOT_BYTES;
/** Where an envelope head's record head (u64 hash, u32 fill) starts: after the 28-byte header. */
const RECORD = 28;

const encoder = new TextEncoder();
const END = (() => {
  const f = new Uint8Array(FRAME_HEAD);
  encodeEnd(f, 0);
  return f;
})();

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

/**
 * Writes a prompt of `nTokens` into P's blocks `ids` (prompt order): pseudo-random
 * finite f16 data in every slot, past the fill too (D must not keep that part), distinct
 * per block and per seed; fills set, full blocks named by the prompt's hashes.
 */
function prefillInto(pool: KvPool, ids: readonly number[], nTokens: number, seed: number): bigint[] {
  const tokens = Array.from({ length: nTokens }, (_, i) => (Math.imul(i + seed, 2654435761) >>> 0) % 32000);
  const hashes = promptHashes(tokens, B);
  expect(ids.length).toBe(Math.ceil(nTokens / B));
  for (let b = 0; b < ids.length; b++) {
    // Each segment's share of the block (one for a pool in one piece), i counting through the payload.
    for (const g of pool.segments) {
      const w = new Uint32Array(g.bytes.buffer, g.bytes.byteOffset + ids[b]! * g.blockBytes, g.blockBytes / 4);
      // low 14 bits of each half: exponent < 31, so every value is finite
      for (let j = 0, i = g.payloadOffset / 4; j < w.length; j++, i++) w[j] = (Math.imul(i + b * 7919 + seed * 104729, 0x9e3779b1) >>> 0) & 0x3fff3fff;
    }
    pool.setFill(ids[b]!, Math.min(B, nTokens - b * B));
    if (b < hashes.length) expect(pool.register(ids[b]!, hashes[b]!)).toBe(true);
  }
  return hashes;
}

/** First byte where `got` differs from `sent` as D must hold it (slots past `fill` zero), or -1. */
function firstDiff(got: Uint8Array, sent: Uint8Array, fill: number): number {
  if (got.length !== sent.length) return -2;
  const live = fill * SLOT_BYTES;
  for (let o = 0; o < got.length; o++) {
    if (got[o] !== (o % SECTION_BYTES < live ? sent[o] : 0)) return o;
  }
  return -1;
}

/** Claims `handle` on D and checks every block against P's payloads as they were sent (`tailFill` 0: no tail). */
function claimAndCompare(d: Decode, handle: string, sent: readonly Uint8Array[], hashes: readonly bigint[], tailFill: number): void {
  const h = d.rx.claim(handle);
  expect(h).not.toBeNull();
  expect(h!.hashes).toEqual([...hashes]);
  expect(h!.nTokens).toBe(hashes.length * B + tailFill);
  expect(h!.blockIds.length).toBe(sent.length);
  const diffs = h!.blockIds.map((id, i) => firstDiff(d.pool.payload(id), sent[i]!, i < hashes.length ? B : tailFill));
  expect(diffs).toEqual(sent.map(() => -1));
  d.pool.releaseAll(h!.blockIds);
}

/**
 * Records the stretches (in blocks) the data plane client writes straight from the
 * pool: it takes them as one view of `pool.bytes` of at least DIRECT_BYTES, while every
 * other view it or the envelope writer takes is one block (`pool.payload`).
 */
function spyDirect(pool: KvPool): number[] {
  const one = pool.segments[0]!;
  const real = one.bytes;
  const stretches: number[] = [];
  const spy = new Uint8Array(real.buffer);
  Object.defineProperty(spy, "subarray", {
    value: (begin?: number, end?: number) => {
      const v = real.subarray(begin, end);
      if (v.length >= DIRECT_BYTES) stretches.push(v.length / pool.blockBytes);
      return v;
    },
  });
  Object.defineProperty(one, "bytes", { value: spy });
  return stretches;
}

interface RunOpts {
  first?: number;
  count?: number;
  total?: number;
  kvFormat?: number;
  payloadBytes?: number;
  handle?: string;
  /** entry slots in the frame (default: one per chunk); slots past the chunks stay zero */
  entries?: number;
}

/** A RUN frame for `chunks`, byte for byte as data-plane-frame.ts lays it out, entries by P's own writer. */
function runFrame(chunks: readonly PoolChunk[], o: RunOpts = {}): Uint8Array {
  const c0 = chunks[0]!;
  const hb = encoder.encode(o.handle ?? c0.handleId);
  const entries = o.entries ?? chunks.length;
  const f = new Uint8Array(runFrameBytes(hb.length, entries));
  const count = o.count ?? chunks.length;
  const head = encodeRunHead(
    f,
    0,
    { first: o.first ?? c0.index, count, total: o.total ?? c0.total, kvFormat: o.kvFormat ?? c0.kvFormat, payloadBytes: o.payloadBytes ?? c0.pool.blockBytes },
    hb,
  );
  // The frame's length is its entry slots', whatever count it claims.
  putU32(f, 0, f.length - 4);
  for (let k = 0; k < Math.min(entries, chunks.length); k++) chunks[k]!.writeRunEntry(f, head + k * RUN_ENTRY);
  return f;
}

/** Offset of entry k in a RUN frame. */
function entryAt(f: Uint8Array, k: number): number {
  return FRAME_HEAD + RUN_FIXED + getU16(f, FRAME_HEAD + RUN_FIXED - 2) + k * RUN_ENTRY;
}

/** Offset of entry k's envelope head (header, then record head at +28). */
function headAt(f: Uint8Array, k: number): number {
  return entryAt(f, k) + RUN_ENTRY_HEAD;
}

/**
 * After an edit of entry k's envelope head: recomputes its trailing CRC field (unless
 * `trailer` is given) and then the chunk CRC, so both CRC checks pass and the reader
 * rules decide.
 */
function reseal(f: Uint8Array, k: number, payload: Uint8Array, trailer?: number): void {
  const h = headAt(f, k);
  const env = concat(f.subarray(h, h + ENVELOPE_HEAD_BYTES), payload, new Uint8Array(4));
  putU32(env, env.length - 4, trailer ?? crc32c(env.subarray(0, env.length - 4)));
  putU32(f, h + ENVELOPE_HEAD_BYTES, getU32(env, env.length - 4));
  putU32(f, entryAt(f, k) + 8, crc32c(env));
}

/** The chunks of a prompt held in P's blocks, as D holding none of them gets them. */
function runChunks(P: KvPool, handle: string, ids: readonly number[], hashes: readonly bigint[]): PoolChunk[] {
  return poolChunks(
    P,
    handle,
    ids,
    hashes,
    hashes.map(() => false),
  ).map((c) => {
    if (!(c instanceof PoolChunk && c.whole)) throw new Error(`chunk ${c.index} is not a full pool block`);
    return c;
  });
}

/** Each chunk's payload, copied out of P's pool (so a case may corrupt its copy). */
function payloadsOf(chunks: readonly PoolChunk[]): Uint8Array[] {
  return chunks.map((c) => c.pool.payload(c.blockId).slice());
}

/** A decode engine of `blocks` blocks on the data plane and a prefill transport, both closed after the file. */
async function decodeAndPrefill(blocks: number): Promise<{ d: Decode; t: ReturnType<typeof prefillTransport> }> {
  const d = await startDecode("data-plane", { shape: SHAPE, blocks });
  const t = prefillTransport("data-plane");
  cleanups.push(
    () => t.close(),
    () => d.close(),
  );
  return { d, t };
}

test("run frames move contiguous and scattered blocks", async () => {
  const { d, t } = await decodeAndPrefill(256);
  const FULL = 40;
  const FILL = 5;
  const nTokens = FULL * B + FILL;
  const range = (a: number, n: number, step = 1) => Array.from({ length: n }, (_, i) => a + i * step);
  // Even ids in a fixed shuffled order: no two blocks of the prompt adjacent in P's pool.
  const even = range(0, FULL + 1, 2);
  for (let i = even.length - 1, s = 7; i > 0; i--) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    const j = s % (i + 1);
    [even[i], even[j]] = [even[j]!, even[i]!];
  }
  const layouts: { name: string; ids: number[]; direct: number[] }[] = [
    { name: "contiguous", ids: range(0, FULL + 1), direct: [FULL] },
    { name: "scattered", ids: even, direct: [] },
    {
      // 10 adjacent (320 KiB: direct), 5 apart, 8 adjacent (exactly 256 KiB: direct),
      // 7 adjacent (224 KiB: copied), 8 descending (not a stretch: copied), 2 apart, the tail.
      name: "mixed",
      ids: [...range(0, 10), ...range(20, 5, 2), ...range(50, 8), ...range(60, 7), ...range(79, 8, -1), 90, 92, 95],
      direct: [10, 8],
    },
  ];
  let seed = 0;
  for (const { name, ids, direct } of layouts) {
    expect([name, ids.length, new Set(ids).size]).toEqual([name, FULL + 1, FULL + 1]);
    const P = new KvPool(SHAPE, 100);
    const all = P.allocate(100)!;
    P.releaseAll(all.filter((id) => !ids.includes(id)));
    const hashes = prefillInto(P, ids, nTokens, ++seed);
    const sent = ids.map((id) => P.payload(id).slice());
    const stretches = spyDirect(P);
    const h = `run-${name}`;
    const st = await transfer(t, d.target, P, h, ids, hashes);
    expect(await dataPlaneOf(t, d.target)).toBe(d.server.dataPlaneAddress);
    expect([name, st]).toEqual([name, { blocksSent: FULL + 1, blocksDeduped: 0, payloadBytes: (FULL + 1) * E, nTokens }]);
    expect([name, stretches]).toEqual([name, direct]);
    // transfer consumed P's references: full blocks stay cached, the tail is free again
    expect([name, P.used, P.cached]).toEqual([name, 0, FULL]);
    claimAndCompare(d, h, sent, hashes, FILL);
  }

  // The contiguous layout's prompt (seed 1) again to a warm D: every full block goes as a dedup, only the tail travels.
  {
    const P = new KvPool(SHAPE, 100);
    const ids = P.allocate(FULL + 1)!;
    const hashes = prefillInto(P, ids, nTokens, 1);
    const sent = ids.map((id) => P.payload(id).slice());
    const stretches = spyDirect(P);
    const st = await transfer(t, d.target, P, "run-warm", ids, hashes);
    expect(st).toEqual({ blocksSent: 1, blocksDeduped: FULL, payloadBytes: E, nTokens });
    expect(stretches).toEqual([]);
    expect(P.used).toBe(0);
    claimAndCompare(d, "run-warm", sent, hashes, FILL);
  }

  // The same prompt, D holding its blocks 10..19 only: a RUN, ten empty CHUNKs, a RUN starting at chunk 20, the tail.
  {
    evictAll(d.pool);
    const P = new KvPool(SHAPE, 100);
    const ids = P.allocate(FULL + 1)!;
    const hashes = prefillInto(P, ids, nTokens, 1);
    const sent = ids.map((id) => P.payload(id).slice());
    const held = d.pool.allocate(10)!;
    held.forEach((id, i) => {
      d.pool.bytes.set(sent[10 + i]!, id * d.pool.blockBytes);
      d.pool.setFill(id, B);
      expect(d.pool.register(id, hashes[10 + i]!)).toBe(true);
    });
    d.pool.releaseAll(held);
    const stretches = spyDirect(P);
    const st = await transfer(t, d.target, P, "run-part-warm", ids, hashes);
    expect(st).toEqual({ blocksSent: FULL + 1 - 10, blocksDeduped: 10, payloadBytes: (FULL + 1 - 10) * E, nTokens });
    expect(stretches).toEqual([10, 20]);
    expect(P.used).toBe(0);
    claimAndCompare(d, "run-part-warm", sent, hashes, FILL);
  }
  expect([d.pool.used, d.rx.pending(), d.rx.inFlight()]).toEqual([0, 0, 0]);
});

test("run frames move a pool split by layer: each block's segments in layer order, straight or staged", async () => {
  const { d, t } = await decodeAndPrefill(128);
  const FULL = 40;
  const nTokens = FULL * B + 5;
  // Layer 0 in one buffer, layers 1..3 in another, as a model in two kernel memories lays a pool out.
  const layer = SHAPE.blockTokens * SLOT_BYTES * 2;
  const rooms = [
    { slab: new SharedArrayBuffer(64 + 100 * layer), slabOffset: 64, firstLayer: 0, nLayers: 1 },
    { slab: new SharedArrayBuffer(100 * 3 * layer), slabOffset: 0, firstLayer: 1, nLayers: 3 },
  ];
  // Adjacent blocks (sent straight from the segments), then blocks two apart (staged, gathered).
  for (const [name, step] of [
    ["adjacent", 1],
    ["apart", 2],
  ] as const) {
    const P = new KvPool(SHAPE, 100, { segments: rooms });
    const all = P.allocate(100)!;
    const ids = Array.from({ length: FULL + 1 }, (_, i) => i * step);
    P.releaseAll(all.filter((id) => !ids.includes(id)));
    const hashes = prefillInto(P, ids, nTokens, step + 10);
    const sent = ids.map((id) => P.payload(id).slice());
    const h = `split-${name}`;
    const st = await transfer(t, d.target, P, h, ids, hashes);
    expect([name, st]).toEqual([name, { blocksSent: FULL + 1, blocksDeduped: 0, payloadBytes: (FULL + 1) * E, nTokens }]);
    expect([name, P.used, P.cached]).toEqual([name, 0, FULL]);
    claimAndCompare(d, h, sent, hashes, 5);
    evictAll(d.pool);
  }
});

describe("hand-crafted RUN frames", () => {
  let d: Decode;
  let P: KvPool;
  let ch: PoolChunk[];
  let hashes: bigint[];
  const dp = () => d.server.dataPlaneAddress;
  const N = 4;

  /** Waits for D's one answer on `c`, or gives up (bounded). */
  async function answer(c: RawConn): Promise<void> {
    expect(await settle(() => c.errors.length + c.acks.length > 0, 3_000)).toBe(true);
  }

  beforeAll(async () => {
    d = await startDecode("data-plane", { shape: SHAPE, blocks: 32 });
    cleanups.push(() => d.close());
    P = new KvPool(SHAPE, 8);
    const ids = P.allocate(N)!;
    hashes = prefillInto(P, ids, N * B, 11);
    ch = runChunks(P, "crafted", ids, hashes);
  });

  test("run frame refusals leave decode clean", async () => {
    const base = snapshot(d.pool, d.rx);

    // The frames as crafted here are what D accepts: the refusals below are the edits'.
    {
      const c = await rawConnect(dp());
      await writeAll(c.socket, concat(runFrame(ch), ...payloadsOf(ch), END));
      await answer(c);
      expect([c.errors, c.acks]).toEqual([[], [{ blocksReceived: N, blocksDeduped: 0, payloadBytes: BigInt(N * E), nTokens: N * B }]]);
      claimAndCompare(d, "crafted", payloadsOf(ch), hashes, 0);
      c.socket.end();
      evictAll(d.pool);
      expect(snapshot(d.pool, d.rx)).toEqual(base);
    }

    interface Case {
      name: string;
      code: number;
      message: RegExp;
      /** sent first; D must then hold `held` blocks of the push, before the rest refuses */
      before?: Uint8Array;
      held?: number;
      then: Uint8Array;
    }
    /** One RUN of all N chunks, `edit` applied to the frame and payloads; the first two payloads go in `before`. */
    const afterTwo = (name: string, code: number, message: RegExp, edit: (f: Uint8Array, p: Uint8Array[]) => void): Case => {
      const f = runFrame(ch);
      const p = payloadsOf(ch);
      edit(f, p);
      return { name, code, message, before: concat(f, p[0]!, p[1]!), held: 2, then: concat(p[2]!, p[3]!, END) };
    };
    const whole = (name: string, code: number, message: RegExp, f: Uint8Array, withPayloads = true): Case => ({
      name,
      code,
      message,
      then: withPayloads ? concat(f, ...payloadsOf(ch), END) : f,
    });
    const cases: Case[] = [
      afterTwo("flipped payload byte", Code.DataLoss, /^chunk 2: crc mismatch/, (_f, p) => (p[2]![12345]! ^= 0x10)),
      afterTwo("flipped envelope head byte", Code.DataLoss, /^chunk 2: crc mismatch/, (f) => (f[headAt(f, 2) + 13]! ^= 1)),
      afterTwo("bad magic, CRCs resealed", Code.DataLoss, /^chunk 2: rule 2: bad magic/, (f, p) => {
        f[headAt(f, 2)]! ^= 0xff;
        reseal(f, 2, p[2]!);
      }),
      afterTwo("envelope CRC field wrong, chunk CRC resealed", Code.DataLoss, /^chunk 2: rule 3: crc mismatch/, (f, p) => {
        reseal(f, 2, p[2]!, getU32(f, headAt(f, 2) + ENVELOPE_HEAD_BYTES) ^ 1);
      }),
      afterTwo("version 2, CRCs resealed", Code.FailedPrecondition, /^chunk 2: rule 4: version 2/, (f, p) => {
        f[headAt(f, 2) + 4] = 2;
        reseal(f, 2, p[2]!);
      }),
      afterTwo("heads and head_dim swapped, CRCs resealed", Code.FailedPrecondition, /^chunk 2: rule 7: shape B=16 L=4 H=32 D=4/, (f, p) => {
        putU32(f, headAt(f, 2) + 20, SHAPE.headDim);
        putU32(f, headAt(f, 2) + 24, SHAPE.nKvHeads);
        reseal(f, 2, p[2]!);
      }),
      afterTwo("fill 0, CRCs resealed", Code.DataLoss, /^chunk 2: rule 8: record 0: fill 0/, (f, p) => {
        putU32(f, headAt(f, 2) + RECORD + 8, 0);
        reseal(f, 2, p[2]!);
      }),
      afterTwo("partial fill under a hash, CRCs resealed", Code.DataLoss, /^chunk 2: rule 9: record 0: hash 0x[0-9a-f]{16} on a partial block/, (f, p) => {
        putU32(f, headAt(f, 2) + RECORD + 8, 5);
        reseal(f, 2, p[2]!);
      }),
      afterTwo(
        "record hash disagrees with the chunk hash",
        Code.DataLoss,
        /^chunk 2: record hash 0x[0-9a-f]{16} \(fill 16\) disagrees with chunk hash/,
        (f) => {
          putU64(f, entryAt(f, 2), getU64(f, entryAt(f, 2)) ^ 1n);
        },
      ),
      afterTwo("hash 0 before the last chunk", Code.InvalidArgument, /^chunk 2 of 4: hash 0 before the last chunk/, (f) => putU64(f, entryAt(f, 2), 0n)),
      whole(
        "payload bytes field not D's block size",
        Code.FailedPrecondition,
        /^run of 16384-byte payloads, pool blocks \(B=16 L=4 H=4 D=32\) are 32768 bytes/,
        runFrame(ch, { payloadBytes: 16384 }),
        false,
      ),
      whole("count 0", Code.InvalidArgument, /^run of 0 chunks, want 1\.\.1024/, runFrame(ch, { count: 0, entries: 0 }), false),
      whole(
        "count past MAX_RUN",
        Code.InvalidArgument,
        /^run of 1025 chunks, want 1\.\.1024/,
        runFrame(ch, { count: MAX_RUN + 1, entries: MAX_RUN + 1 }),
        false,
      ),
      whole("fewer entries than count", Code.InvalidArgument, /^run frame of \d+ bytes, want \d+ for 4 chunks/, runFrame(ch, { entries: 3 }), false),
      whole("more entries than count", Code.InvalidArgument, /^run frame of \d+ bytes, want \d+ for 3 chunks/, runFrame(ch, { count: 3 }), false),
      whole(
        "handle longer than the frame",
        Code.InvalidArgument,
        /^run frame of \d+ bytes, want/,
        (() => {
          const f = runFrame(ch);
          f[26] = 0xff;
          return f;
        })(),
        false,
      ),
      whole(
        "frame shorter than a RUN head",
        Code.InvalidArgument,
        /^run frame of 15 bytes/,
        (() => {
          const f = new Uint8Array(15);
          putU32(f, 0, 11);
          f[4] = FRAME_RUN;
          return f;
        })(),
        false,
      ),
      whole("first index 1", Code.InvalidArgument, /^chunk index 1, want 0/, concat(runFrame(ch.slice(1)), ...payloadsOf(ch.slice(1))), false),
      whole("kv_format 2", Code.FailedPrecondition, /^kv_format 2 not spoken/, runFrame(ch, { kvFormat: 2 })),
      whole("total 0", Code.InvalidArgument, /^total 0 must be ≥ 1/, runFrame(ch, { total: 0 }), false),
      whole("empty handle", Code.InvalidArgument, /^empty handle_id/, runFrame(ch, { handle: "" }), false),
      // Refusals on a later RUN frame of the same push, after the first one's blocks were taken.
      ...(
        [
          ["second RUN skips a chunk", Code.InvalidArgument, /^chunk index 3, want 2/, runFrame(ch.slice(3)), ch.slice(3)],
          ["second RUN repeats a chunk", Code.InvalidArgument, /^chunk index 1, want 2/, runFrame(ch.slice(1)), ch.slice(1)],
          ["second RUN with another total", Code.InvalidArgument, /^chunk 2: total 5, push has 4/, runFrame(ch.slice(2), { total: 5 }), ch.slice(2)],
          [
            "second RUN with another handle",
            Code.InvalidArgument,
            /^chunk 2: handle other, push is crafted/,
            runFrame(ch.slice(2), { handle: "other" }),
            ch.slice(2),
          ],
        ] as const
      ).map(
        ([name, code, message, f, rest]): Case => ({
          name,
          code,
          message,
          before: concat(runFrame(ch.slice(0, 2)), ...payloadsOf(ch.slice(0, 2))),
          held: 2,
          then: concat(f, ...payloadsOf(rest), END),
        }),
      ),
      {
        name: "END before total",
        code: Code.InvalidArgument,
        message: /^push crafted ended after 4 of 5 chunks/,
        before: concat(runFrame(ch, { total: 5 }), ...payloadsOf(ch)),
        held: 4,
        then: END,
      },
    ];
    for (const k of cases) {
      const c = await rawConnect(dp());
      if (k.before !== undefined) {
        await writeAll(c.socket, k.before);
        await settle(() => d.pool.used === base.used + k.held! || c.errors.length > 0, 3_000);
        expect([k.name, d.pool.used - base.used, c.errors]).toEqual([k.name, k.held!, []]);
      }
      await writeAll(c.socket, k.then);
      await answer(c);
      expect([k.name, c.acks.length, c.errors[0]?.code, c.errors[0]?.message]).toEqual([k.name, 0, k.code, expect.stringMatching(k.message)]);
      // Whatever followed the refusal was discarded, not taken as the start of a frame.
      await Bun.sleep(5);
      expect([k.name, c.errors.length]).toEqual([k.name, 1]);
      c.socket.end();
      expect([k.name, snapshot(d.pool, d.rx)]).toEqual([k.name, base]);
    }

    // D runs out of blocks on the third payload: the two it took are freed.
    {
      const hog = d.pool.allocate(d.pool.available - 2)!;
      const mid = snapshot(d.pool, d.rx);
      const c = await rawConnect(dp());
      await writeAll(c.socket, concat(runFrame(ch), ...payloadsOf(ch), END));
      await answer(c);
      expect([c.errors[0]?.code, c.errors[0]?.message]).toEqual([Code.ResourceExhausted, expect.stringMatching(/^chunk 2: no free block/)]);
      c.socket.end();
      expect(snapshot(d.pool, d.rx)).toEqual(mid);
      d.pool.releaseAll(hog);
      expect(snapshot(d.pool, d.rx)).toEqual(base);
    }
  });

  test("run cut mid payload frees decode", async () => {
    const base = snapshot(d.pool, d.rx);
    const f = runFrame(ch);
    const p = payloadsOf(ch);
    const P2 = p[2]!.length / 2;
    const cuts: { name: string; sent: Uint8Array; held: number; hard: boolean }[] = [
      { name: "inside the entries", sent: f.subarray(0, f.length - 30), held: 0, hard: false },
      { name: "2.5 payloads in", sent: concat(f, p[0]!, p[1]!, p[2]!.subarray(0, P2)), held: 2, hard: false },
      { name: "2.5 payloads in, reset", sent: concat(f, p[0]!, p[1]!, p[2]!.subarray(0, P2)), held: 2, hard: true },
      {
        name: "inside a second RUN's entries",
        sent: concat(runFrame(ch.slice(0, 2)), p[0]!, p[1]!, runFrame(ch.slice(2)).subarray(0, 40)),
        held: 2,
        hard: false,
      },
      { name: "every payload, no END", sent: concat(f, ...p), held: 4, hard: false },
    ];
    for (const k of cuts) {
      const c = await rawConnect(dp());
      await writeAll(c.socket, k.sent);
      await settle(() => d.pool.used === base.used + k.held && d.rx.inFlight() === (k.held > 0 ? 1 : 0));
      expect([k.name, d.pool.used - base.used]).toEqual([k.name, k.held]);
      if (k.hard) c.socket.terminate();
      else c.socket.end();
      expect([k.name, await settle(() => d.rx.inFlight() === 0 && d.pool.used === base.used)]).toEqual([k.name, true]);
      expect([k.name, snapshot(d.pool, d.rx), c.errors]).toEqual([k.name, base, []]);
    }
    // Nothing of the cut pushes lingers: the same handle is pushed whole on a new connection.
    const c = await rawConnect(dp());
    await writeAll(c.socket, concat(f, ...p, END));
    await answer(c);
    expect([c.errors, c.acks.length]).toEqual([[], 1]);
    expect(d.rx.release("crafted")).toBe(true);
    c.socket.end();
    evictAll(d.pool);
    expect(snapshot(d.pool, d.rx)).toEqual(base);
  });

  test("run split across reads is reassembled", async () => {
    // D's free blocks hold stale bytes, as after earlier requests: the tail must still come out zero past its fill.
    const stale = d.pool.allocate(d.pool.available)!;
    for (const id of stale) d.pool.payload(id).fill(0x55);
    d.pool.releaseAll(stale);
    const base = snapshot(d.pool, d.rx);
    // Piece sizes: below a frame head, odd, around and past a payload (32 KiB).
    const patterns: [string, number[]][] = [
      ["odd", [3, 7, 4093, 1000, 2, 40_000, 1, 32_768]],
      ["1000", [1000]],
    ];
    for (const [name, sizes] of patterns) {
      const Q = new KvPool(SHAPE, 8);
      const ids = Q.allocate(5)!;
      const hashes = prefillInto(Q, ids, 5 * B, name.length + 20);
      const chunks = runChunks(Q, `split-${name}`, ids, hashes);
      const sent = payloadsOf(chunks);
      // Two RUN frames in one push: the second frame's head lands mid-read as well. Its
      // last entry is made a partial tail (fill 5, no hash), which a RUN may carry as a
      // CHUNK does; its payload holds data past the fill, which D must not keep.
      const second = runFrame(chunks.slice(3));
      putU64(second, entryAt(second, 1), 0n);
      putU64(second, headAt(second, 1) + RECORD, 0n);
      putU32(second, headAt(second, 1) + RECORD + 8, 5);
      reseal(second, 1, sent[4]!);
      const bytes = concat(runFrame(chunks.slice(0, 3)), ...sent.slice(0, 3), second, ...sent.slice(3), END);
      const c = await rawConnect(dp());
      for (let off = 0, i = 0; off < bytes.length; i++) {
        const n = Math.min(sizes[i % sizes.length]!, bytes.length - off);
        await writeAll(c.socket, bytes.subarray(off, off + n));
        off += n;
        // A pause lets D read what is there, so the next piece comes in another read.
        await Bun.sleep(1);
      }
      await answer(c);
      expect([name, c.errors, c.acks]).toEqual([name, [], [{ blocksReceived: 5, blocksDeduped: 0, payloadBytes: BigInt(5 * E), nTokens: 4 * B + 5 }]]);
      claimAndCompare(d, `split-${name}`, sent, hashes.slice(0, 4), 5);
      c.socket.end();
    }
    evictAll(d.pool);
    expect(snapshot(d.pool, d.rx)).toEqual(base);
  });
});
