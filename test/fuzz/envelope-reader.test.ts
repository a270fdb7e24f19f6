// Mutated envelopes and chunks against readEnvelope and KvReceiver sessions, judged by
// an oracle written from kv-block.md's reader rules ("What a reader checks") and grpc-services.md's PushKv rules ("How the decode side takes a push") (not
// from the implementation): every input is refused with the code the spec gives or
// accepted only when valid, refusals leave D's pool and receiver exactly as they were,
// and nothing but EnvError / KvError is ever thrown.
//
// Fixed seed; TL_FUZZ_RUNS raises the total count (default 100 000), TL_FUZZ_SEED changes it.
import { expect, test } from "bun:test";
import fc from "fast-check";
import { crc32c, envelopeBytes, EnvError, readEnvelope, writeEnvelope, type EnvelopeRecord, type KvShape } from "../../src/codec/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { Code, codeName } from "../../src/rpc/status.ts";
import { acceptAll, buildChunks, KvError, KvReceiver, type KvChunkLike, type PushSession } from "../../src/transfer/index.ts";
import { ENVELOPE_HEAD_BYTES } from "../../src/codec/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";

const RUNS = Number(process.env.TL_FUZZ_RUNS ?? 100_000);
const SEED = Number(process.env.TL_FUZZ_SEED ?? 20240607);
const ENVELOPE_RUNS = Math.ceil(RUNS * 0.6);
const PUSH_RUNS = RUNS - ENVELOPE_RUNS;

const DATA_LOSS = 15;
const FAILED_PRECONDITION = 9;

// ---------------------------------------------------------------------------------------
// The oracle: kv-block.md "What a reader checks", in order, with lengths in BigInt so no overflow
// can hide a wrong answer.

type Verdict =
  | { ok: true; n: number; shape: KvShape; records: { hash: bigint; fill: number; payload: Uint8Array }[] }
  | { ok: false; rule: number; code: number };

function u16(b: Uint8Array, o: number): number {
  return b[o]! | (b[o + 1]! << 8);
}
function u32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}
function u64(b: Uint8Array, o: number): bigint {
  return BigInt(u32(b, o)) | (BigInt(u32(b, o + 4)) << 32n);
}

function judgeEnvelope(buf: Uint8Array, expect?: KvShape): Verdict {
  const len = buf.length;
  if (len < 32) return { ok: false, rule: 1, code: DATA_LOSS };
  if (!(buf[0] === 0x54 && buf[1] === 0x4c && buf[2] === 0x4b && buf[3] === 0x56)) return { ok: false, rule: 2, code: DATA_LOSS };
  if (crc32c(buf.subarray(0, len - 4)) !== u32(buf, len - 4)) return { ok: false, rule: 3, code: DATA_LOSS };
  if (u16(buf, 4) !== 1) return { ok: false, rule: 4, code: FAILED_PRECONDITION };
  if (u16(buf, 6) !== 1) return { ok: false, rule: 5, code: FAILED_PRECONDITION };
  const n = u32(buf, 8);
  const [B, L, H, D] = [u32(buf, 12), u32(buf, 16), u32(buf, 20), u32(buf, 24)];
  const P = 2n * BigInt(L) * BigInt(H) * BigInt(B) * BigInt(D) * 2n;
  const E = 28n + BigInt(n) * (12n + P) + 4n;
  if (B < 1 || L < 1 || H < 1 || D < 1 || E !== BigInt(len)) return { ok: false, rule: 6, code: DATA_LOSS };
  const shape = { blockTokens: B, nLayers: L, nKvHeads: H, headDim: D };
  if (expect && (B !== expect.blockTokens || L !== expect.nLayers || H !== expect.nKvHeads || D !== expect.headDim)) {
    return { ok: false, rule: 7, code: FAILED_PRECONDITION };
  }
  const rec = 12 + Number(P);
  const records = [];
  for (let i = 0; i < n; i++) {
    const o = 28 + i * rec;
    records.push({ hash: u64(buf, o), fill: u32(buf, o + 8), payload: buf.subarray(o + 12, o + rec) });
  }
  if (records.some((r) => r.fill < 1 || r.fill > B)) return { ok: false, rule: 8, code: DATA_LOSS };
  if (records.some((r) => r.hash !== 0n && r.fill !== B)) return { ok: false, rule: 9, code: DATA_LOSS };
  return { ok: true, n, shape, records };
}

// ---------------------------------------------------------------------------------------
// Mutations of one envelope.

type Mutation =
  | { t: "flip"; at: number; bit: number }
  | { t: "byte"; at: number; value: number }
  /** keeps `keep` mod (length + 1) bytes */
  | { t: "truncate"; keep: number }
  | { t: "extend"; bytes: number[] }
  | { t: "u32"; field: number; value: number }
  | { t: "u16"; field: number; value: number }
  | { t: "fill"; record: number; value: number }
  | { t: "hash"; record: number; value: bigint }
  | { t: "reshape"; n: number; dims: [number, number, number, number] };

const interesting = fc.oneof(
  fc.constantFrom(0, 1, 2, 3, 4, 5, 8, 0xffff, 0x10000, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff),
  fc.integer({ min: 0, max: 0xffffffff }),
);

// Unbiased: fast-check's default bias toward small values would hit byte 0 (the magic) far too often.
const position = fc.noBias(fc.nat(0xffff));

const mutationArb: fc.Arbitrary<Mutation> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ t: fc.constant("flip" as const), at: position, bit: fc.integer({ min: 0, max: 7 }) }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("byte" as const), at: position, value: fc.integer({ min: 0, max: 255 }) }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("truncate" as const), keep: position }) },
  {
    weight: 2,
    arbitrary: fc.record({ t: fc.constant("extend" as const), bytes: fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 40 }) }),
  },
  { weight: 4, arbitrary: fc.record({ t: fc.constant("u32" as const), field: fc.constantFrom(8, 12, 16, 20, 24), value: interesting }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("u16" as const), field: fc.constantFrom(0, 2, 4, 6), value: fc.constantFrom(0, 1, 2, 3, 0xffff) }) },
  { weight: 3, arbitrary: fc.record({ t: fc.constant("fill" as const), record: fc.nat(3), value: interesting }) },
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constant("hash" as const),
      record: fc.nat(3),
      value: fc.oneof(fc.constant(0n), fc.constant(1n), fc.bigInt({ min: 0n, max: (1n << 64n) - 1n })),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant("reshape" as const),
      n: fc.integer({ min: 0, max: 3 }),
      dims: fc.tuple(fc.integer({ min: 0, max: 4 }), fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 4 })),
    }),
  },
);

function put32(b: Uint8Array, o: number, v: number): void {
  if (o < 0 || o + 4 > b.length) return;
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
  b[o + 2] = (v >>> 16) & 0xff;
  b[o + 3] = (v >>> 24) & 0xff;
}

/** Where record `i`'s head starts, per the envelope's own header (what a reader would use). */
function recordAt(b: Uint8Array, i: number): number {
  const P = 4 * u32(b, 12) * u32(b, 16) * u32(b, 20) * u32(b, 24);
  return 28 + i * (12 + P);
}

function mutate(src: Uint8Array, muts: readonly Mutation[], reseal: boolean): Uint8Array {
  let b = src.slice();
  for (const m of muts) {
    switch (m.t) {
      case "flip":
        if (b.length > 0) b[m.at % b.length]! ^= 1 << m.bit;
        break;
      case "byte":
        if (b.length > 0) b[m.at % b.length] = m.value;
        break;
      case "truncate":
        b = b.slice(0, m.keep % (b.length + 1));
        break;
      case "extend": {
        const x = new Uint8Array(b.length + m.bytes.length);
        x.set(b);
        x.set(m.bytes, b.length);
        b = x;
        break;
      }
      case "u32":
        put32(b, m.field, m.value);
        break;
      case "u16":
        if (m.field + 2 <= b.length) {
          b[m.field] = m.value & 0xff;
          b[m.field + 1] = m.value >>> 8;
        }
        break;
      case "fill":
        if (b.length >= 28) put32(b, recordAt(b, m.record) + 8, m.value);
        break;
      case "hash":
        if (b.length >= 28) {
          const o = recordAt(b, m.record);
          put32(b, o, Number(m.value & 0xffffffffn));
          put32(b, o + 4, Number(m.value >> 32n));
        }
        break;
      case "reshape": {
        // New dims and count, body resized to match: reaches the shape and record rules.
        const [B, L, H, D] = m.dims;
        const E = 28 + m.n * (12 + 4 * B * L * H * D) + 4;
        const x = new Uint8Array(Math.max(32, E));
        x.set(b.subarray(0, Math.min(b.length, x.length)));
        if (x.length >= 28) {
          put32(x, 8, m.n);
          put32(x, 12, B);
          put32(x, 16, L);
          put32(x, 20, H);
          put32(x, 24, D);
        }
        b = x;
        break;
      }
    }
  }
  if (reseal && b.length >= 4) put32(b, b.length - 4, crc32c(b.subarray(0, b.length - 4)));
  return b;
}

// ---------------------------------------------------------------------------------------
// Valid envelopes to start from.

const SHAPES: KvShape[] = [
  { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 }, // kv-block.md's worked example: P = 16
  { blockTokens: 4, nLayers: 2, nKvHeads: 1, headDim: 4 }, // the transfer arithmetic example: P = 128
  { blockTokens: 3, nLayers: 1, nKvHeads: 2, headDim: 1 },
];

function bytesFrom(seed: number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

const baseArb = fc.record({
  shape: fc.nat(SHAPES.length - 1),
  records: fc.array(
    fc.record({ full: fc.boolean(), fill: fc.nat(), hashed: fc.boolean(), hash: fc.bigInt({ min: 1n, max: (1n << 64n) - 1n }), seed: fc.nat() }),
    {
      minLength: 0,
      maxLength: 3,
    },
  ),
});

type BaseCase = typeof baseArb extends fc.Arbitrary<infer T> ? T : never;

function buildBase(b: BaseCase): { shape: KvShape; buf: Uint8Array } {
  const shape = SHAPES[b.shape]!;
  const B = shape.blockTokens;
  const P = 4 * B * shape.nLayers * shape.nKvHeads * shape.headDim;
  const records: EnvelopeRecord[] = b.records.map((r) => {
    const fill = r.full ? B : 1 + (r.fill % B);
    return { hash: fill === B && r.hashed ? r.hash : 0n, nTokens: fill, payload: bytesFrom(r.seed, P) };
  });
  return { shape, buf: writeEnvelope({ version: 1, dtype: 1, nBlocks: records.length, ...shape }, records) };
}

const envelopeCaseArb = fc.record({
  base: baseArb,
  muts: fc.array(mutationArb, { minLength: 1, maxLength: 3 }),
  reseal: fc.double({ min: 0, max: 1, noNaN: true }).map((x) => x < 0.75),
  withExpect: fc.boolean(),
});

function fail(msg: string): never {
  throw new Error(msg);
}

/** readEnvelope against the oracle: the same rule and code, or the same records. */
function checkEnvelope(buf: Uint8Array, expect: KvShape | undefined, stats: Map<string, number>): void {
  const want = judgeEnvelope(buf, expect);
  let got: ReturnType<typeof readEnvelope> | undefined;
  try {
    got = readEnvelope(buf, expect);
  } catch (e) {
    if (!(e instanceof EnvError)) fail(`untyped error from readEnvelope: ${String(e)}`);
    if (want.ok) fail(`valid envelope refused: ${e.message}`);
    if (e.rule !== want.rule || e.code !== want.code)
      fail(`refused by rule ${e.rule} (code ${e.code}), oracle says rule ${want.rule} (code ${want.code}): ${e.message}`);
    if (!e.message.startsWith(`rule ${e.rule}: `)) fail(`message does not name the rule: ${e.message}`);
    const k = `rule ${e.rule}`;
    stats.set(k, (stats.get(k) ?? 0) + 1);
    return;
  }
  if (!want.ok) fail(`accepted an envelope the oracle refuses by rule ${want.rule}`);
  const h = got.header;
  if (
    h.nBlocks !== want.n ||
    h.blockTokens !== want.shape.blockTokens ||
    h.nLayers !== want.shape.nLayers ||
    h.nKvHeads !== want.shape.nKvHeads ||
    h.headDim !== want.shape.headDim
  ) {
    fail(`accepted with header ${JSON.stringify(h)}, oracle reads n=${want.n} ${JSON.stringify(want.shape)}`);
  }
  want.records.forEach((r, i) => {
    const g = got!.records[i]!;
    if (g.hash !== r.hash || g.nTokens !== r.fill || !Buffer.from(g.payload).equals(Buffer.from(r.payload)))
      fail(`record ${i} read differently than the oracle`);
  });
  stats.set("accepted", (stats.get("accepted") ?? 0) + 1);
}

// ---------------------------------------------------------------------------------------
// Receiver sessions: a push built by the real prefill side, then mutated.

const RX_SHAPE: KvShape = { blockTokens: 2, nLayers: 1, nKvHeads: 2, headDim: 2 };
const RX_B = RX_SHAPE.blockTokens;

type ChunkEdit =
  | { t: "handle"; i: number; value: string }
  | { t: "index"; i: number; delta: number }
  | { t: "total"; i: number; value: number }
  | { t: "hash"; i: number; how: "zero" | "xor" | "other" | "random"; value: bigint }
  | { t: "format"; i: number; value: number }
  | { t: "crc"; i: number; xor: number }
  | { t: "envelope"; i: number; muts: Mutation[]; reseal: boolean; rechunk: boolean }
  | { t: "empty"; i: number }
  | { t: "drop"; i: number }
  | { t: "dup"; i: number }
  | { t: "swap"; i: number; j: number }
  | { t: "cutTail"; keep: number };

const chunkEditArb: fc.Arbitrary<ChunkEdit> = fc.oneof(
  fc.record({ t: fc.constant("handle" as const), i: fc.nat(8), value: fc.constantFrom("", "held", "other", "h") }),
  fc.record({ t: fc.constant("index" as const), i: fc.nat(8), delta: fc.constantFrom(-1, 1, 2, 1000, -0x80000000) }),
  fc.record({ t: fc.constant("total" as const), i: fc.nat(8), value: fc.constantFrom(0, 1, 2, 3, 7, 0xffffffff) }),
  fc.record({
    t: fc.constant("hash" as const),
    i: fc.nat(8),
    how: fc.constantFrom("zero" as const, "xor" as const, "other" as const, "random" as const),
    value: fc.bigInt({ min: 1n, max: (1n << 64n) - 1n }),
  }),
  fc.record({ t: fc.constant("format" as const), i: fc.nat(8), value: fc.constantFrom(0, 2, 0xffffffff) }),
  fc.record({ t: fc.constant("crc" as const), i: fc.nat(8), xor: fc.integer({ min: 1, max: 0xffffffff }) }),
  {
    weight: 4,
    arbitrary: fc.record({
      t: fc.constant("envelope" as const),
      i: fc.nat(8),
      muts: fc.array(mutationArb, { minLength: 1, maxLength: 2 }),
      reseal: fc.boolean(),
      rechunk: fc.double({ min: 0, max: 1, noNaN: true }).map((x) => x < 0.85),
    }),
  },
  fc.record({ t: fc.constant("empty" as const), i: fc.nat(8) }),
  fc.record({ t: fc.constant("drop" as const), i: fc.nat(8) }),
  fc.record({ t: fc.constant("dup" as const), i: fc.nat(8) }),
  fc.record({ t: fc.constant("swap" as const), i: fc.nat(8), j: fc.nat(8) }),
  fc.record({ t: fc.constant("cutTail" as const), keep: fc.nat(8) }),
);

const pushCaseArb = fc.record({
  promptLen: fc.integer({ min: 1, max: 11 }),
  promptSeed: fc.integer({ min: 1, max: 50 }),
  /** leading full blocks D caches before the push */
  warm: fc.nat(5),
  /** what P believes D holds, per full block (may be stale: NOT_FOUND) */
  present: fc.array(fc.boolean(), { minLength: 6, maxLength: 6 }),
  /** a handle already pending on D */
  held: fc.boolean(),
  edits: fc.array(chunkEditArb, { minLength: 0, maxLength: 2 }),
  /** the client goes away after this many chunks instead of ending the push (-1: it ends it) */
  abortAfter: fc.oneof({ weight: 5, arbitrary: fc.constant(-1) }, { weight: 1, arbitrary: fc.nat(6) }),
  /** envelopes of one block's length arrive cut in three, as in the data plane's RUN frames (acceptParts) */
  parts: fc.boolean(),
});

function applyEdit(chunks: KvChunkLike[], e: ChunkEdit): KvChunkLike[] {
  if (chunks.length === 0) return chunks;
  const i = "i" in e ? e.i % chunks.length : 0;
  const c = chunks[i]!;
  switch (e.t) {
    case "handle":
      c.handleId = e.value;
      break;
    case "index":
      c.index = (c.index + e.delta) >>> 0;
      break;
    case "total":
      c.total = e.value;
      break;
    case "hash":
      c.hash = e.how === "zero" ? 0n : e.how === "xor" ? c.hash ^ 1n : e.how === "other" ? chunks[(i + 1) % chunks.length]!.hash : e.value;
      break;
    case "format":
      c.kvFormat = e.value;
      break;
    case "crc":
      c.crc32c = (c.crc32c ^ e.xor) >>> 0;
      break;
    case "envelope":
      if (c.envelope.length > 0) {
        c.envelope = mutate(c.envelope, e.muts, e.reseal);
        if (e.rechunk) c.crc32c = crc32c(c.envelope);
      }
      break;
    case "empty":
      c.envelope = new Uint8Array(0);
      c.crc32c = 0;
      break;
    case "drop":
      return chunks.filter((_, k) => k !== i);
    case "dup":
      return [...chunks.slice(0, i + 1), { ...c }, ...chunks.slice(i + 1)];
    case "swap": {
      const j = e.j % chunks.length;
      [chunks[i], chunks[j]] = [chunks[j]!, chunks[i]!];
      break;
    }
    case "cutTail":
      return chunks.slice(0, e.keep % (chunks.length + 1));
  }
  return chunks;
}

/**
 * grpc-services.md's PushKv rules ("How the decode side takes a push") over D's state before the push: the codes the first
 * broken rule may carry (a chunk breaking several may be refused for any of them), or
 * null when the push must be accepted. No eviction can happen: D has room for every block.
 */
function judgePush(chunks: readonly KvChunkLike[], d: KvPool, pendingIds: Set<string>, ended: boolean): Set<number> | null {
  const IA = Code.InvalidArgument;
  const first = chunks[0]!;
  const begin = new Set<number>();
  if (first.handleId === "" || !(first.total >= 1)) begin.add(IA);
  else if (pendingIds.has(first.handleId)) begin.add(Code.AlreadyExists);
  if (begin.size > 0) return begin;
  const { handleId, total } = first;
  for (let k = 0; k < chunks.length; k++) {
    const c = chunks[k]!;
    const why = new Set<number>();
    if (c.handleId !== handleId || c.total !== total || c.index !== k) why.add(IA);
    if (c.kvFormat !== 1) why.add(Code.FailedPrecondition);
    if (c.hash === 0n && c.index !== total - 1) why.add(IA);
    if (crc32c(c.envelope) !== c.crc32c) why.add(DATA_LOSS);
    if (c.envelope.length === 0) {
      if (c.hash === 0n) why.add(IA);
      else if (d.lookup(c.hash) < 0) why.add(Code.NotFound);
    } else {
      const v = judgeEnvelope(c.envelope, d.shape);
      if (!v.ok) why.add(v.code);
      else if (v.n !== 1) why.add(IA);
      else {
        const r = v.records[0]!;
        // The record's own hash must be the chunk's; a hashless record takes the chunk's hash only when full.
        if (r.hash !== 0n ? r.hash !== c.hash : c.hash !== 0n && r.fill !== RX_B) why.add(DATA_LOSS);
      }
    }
    if (why.size > 0) return why;
  }
  if (!ended) return new Set([Code.Canceled]); // the client went away: refused (we abort it ourselves)
  if (chunks.length !== total) return new Set([IA]);
  return null;
}

/** What a pool block holds after importing `payload` with fill `fill`: slots at and past the fill are zero (kv-block.md). */
function live(payload: Uint8Array, fill: number): Uint8Array {
  const out = payload.slice();
  const slot = RX_SHAPE.nKvHeads * RX_SHAPE.headDim * 2;
  const section = RX_B * slot;
  for (let sec = 0; sec < 2 * RX_SHAPE.nLayers; sec++) out.fill(0, sec * section + fill * slot, (sec + 1) * section);
  return out;
}

interface Snap {
  used: number;
  cached: number;
  free: number;
  pending: number;
  inFlight: number;
}
const snap = (p: KvPool, rx: KvReceiver): Snap => ({ used: p.used, cached: p.cached, free: p.free, pending: rx.pending(), inFlight: rx.inFlight() });
const sameSnap = (a: Snap, b: Snap) => a.used === b.used && a.cached === b.cached && a.free === b.free && a.pending === b.pending && a.inFlight === b.inFlight;

type PushCase = typeof pushCaseArb extends fc.Arbitrary<infer T> ? T : never;

function runPush(pc: PushCase, stats: Map<string, number>): void {
  const tokens = fakePrompt(pc.promptLen, pc.promptSeed, 250);
  const P = new KvPool(RX_SHAPE, 16);
  const D = new KvPool(RX_SHAPE, 40);
  const rx = new KvReceiver(D, { pushIdleTimeoutMs: 10_000, ttlMs: 60_000 });
  try {
    const nFull = Math.floor(tokens.length / RX_B);
    const warm = Math.min(pc.warm, nFull);
    if (warm > 0) D.releaseAll(fakePrefill(D, tokens.slice(0, warm * RX_B))!.ids);
    const pendingIds = new Set<string>();
    if (pc.held) {
      const other = fakePrefill(P, fakePrompt(3, 999, 250))!;
      acceptAll(rx, buildChunks(P, "held", other.ids, other.hashes, [false]));
      P.releaseAll(other.ids);
      pendingIds.add("held");
    }
    const pre = fakePrefill(P, tokens)!;
    const built = buildChunks(
      P,
      "h",
      pre.ids,
      pre.hashes,
      pre.hashes.map((_, i) => pc.present[i]!),
    );
    // Own copies: edits must not reach the shared slab, and accepted payloads are compared below.
    let chunks: KvChunkLike[] = built.map((c) => ({ ...c, envelope: c.envelope.slice() }));
    for (const e of pc.edits) chunks = applyEdit(chunks, e);
    if (chunks.length === 0) return;
    const ended = pc.abortAfter < 0 || pc.abortAfter >= chunks.length;
    const fed = ended ? chunks : chunks.slice(0, pc.abortAfter);
    const want = fed.length === 0 ? new Set([Code.Canceled]) : judgePush(fed, D, pendingIds, ended);
    const base = snap(D, rx);

    // Driven as the gRPC service and the data plane drive it: begin on the first chunk, accept each, finish at the end.
    let s: PushSession | undefined;
    let err: unknown;
    let ack;
    try {
      for (const c of fed) {
        s ??= rx.begin(c.handleId, c.total);
        const n = c.envelope.length;
        if (pc.parts && n === envelopeBytes(RX_SHAPE, 1)) {
          s.acceptParts(
            c,
            c.envelope,
            0,
            c.envelope.subarray(ENVELOPE_HEAD_BYTES, n - 4),
            new DataView(c.envelope.buffer, c.envelope.byteOffset + n - 4, 4).getUint32(0, true),
          );
        } else {
          s.accept(c);
        }
      }
      if (!ended) throw new KvError(Code.Canceled, "client went away");
      ack = s!.finish();
    } catch (e) {
      s?.abort();
      err = e;
    }

    if (err !== undefined) {
      if (!(err instanceof KvError)) fail(`untyped error from the receiver: ${String(err)}`);
      if (want === null) fail(`valid push refused: ${codeName(err.code)} ${err.message}`);
      if (!want.has(err.code)) fail(`refused with ${codeName(err.code)} (${err.message}), oracle allows ${[...want].map(codeName).join("|")}`);
      const after = snap(D, rx);
      if (!sameSnap(after, base)) fail(`refusal left D changed: ${JSON.stringify(base)} -> ${JSON.stringify(after)}`);
      const k = codeName(err.code);
      stats.set(k, (stats.get(k) ?? 0) + 1);
      return;
    }
    if (want !== null) fail(`accepted a push the oracle refuses (${[...want].map(codeName).join("|")})`);
    // Accepted: D holds exactly what the chunks said, under their handle.
    const id = fed[0]!.handleId;
    const held = rx.claim(id);
    if (held === null) fail(`accepted handle ${id} not pending`);
    let fills = 0;
    let bytes = 0;
    let received = 0;
    fed.forEach((c, k) => {
      const bid = held.blockIds[k]!;
      let payload: Uint8Array;
      if (c.envelope.length === 0) {
        payload = D.payload(D.lookup(c.hash));
        if (D.lookup(c.hash) !== bid) fail(`chunk ${k}: dedup block is not D's cached ${c.hash}`);
        fills += RX_B;
      } else {
        const v = judgeEnvelope(c.envelope, RX_SHAPE);
        if (!v.ok) fail("unreachable");
        payload = live(v.records[0]!.payload, v.records[0]!.fill);
        fills += v.records[0]!.fill;
        bytes += c.envelope.length;
        received++;
      }
      if (!Buffer.from(D.payload(bid)).equals(Buffer.from(payload))) fail(`chunk ${k}: block ${bid} does not hold the chunk's payload`);
    });
    if (held.nTokens !== fills || held.blockIds.length !== fed.length)
      fail(`handle holds ${held.nTokens} tokens in ${held.blockIds.length} blocks, chunks say ${fills} in ${fed.length}`);
    if (ack!.blocksReceived !== received || ack!.blocksDeduped !== fed.length - received || ack!.payloadBytes !== BigInt(bytes) || ack!.nTokens !== fills) {
      fail(`ack ${JSON.stringify({ ...ack!, payloadBytes: String(ack!.payloadBytes) })} disagrees with the chunks`);
    }
    D.releaseAll(held.blockIds);
    rx.release("held");
    if (D.used !== 0 || rx.pending() !== 0 || rx.inFlight() !== 0) fail(`after release D has used ${D.used}, pending ${rx.pending()}`);
    stats.set("accepted", (stats.get("accepted") ?? 0) + 1);
  } finally {
    rx.close();
  }
}

test("fuzz envelope reader", () => {
  const started = performance.now();
  const envStats = new Map<string, number>();
  fc.assert(
    fc.property(envelopeCaseArb, (c) => {
      const { shape, buf } = buildBase(c.base);
      checkEnvelope(mutate(buf, c.muts, c.reseal), c.withExpect ? shape : undefined, envStats);
    }),
    { seed: SEED, numRuns: ENVELOPE_RUNS },
  );
  const envMs = performance.now() - started;
  const pushStats = new Map<string, number>();
  fc.assert(
    fc.property(pushCaseArb, (pc) => runPush(pc, pushStats)),
    { seed: SEED + 1, numRuns: PUSH_RUNS },
  );
  const totalMs = performance.now() - started;
  console.log(
    `fuzz_envelope_reader: ${ENVELOPE_RUNS} envelopes in ${envMs.toFixed(0)} ms ${JSON.stringify(Object.fromEntries(envStats))}; ` +
      `${PUSH_RUNS} pushes in ${(totalMs - envMs).toFixed(0)} ms ${JSON.stringify(Object.fromEntries(pushStats))}`,
  );
  // The run must reach every rule and every refusal, else the mutations are too weak to mean anything.
  for (const r of [1, 2, 3, 4, 5, 6, 7, 8, 9]) expect([`rule ${r}`, envStats.get(`rule ${r}`) ?? 0]).not.toEqual([`rule ${r}`, 0]);
  expect(envStats.get("accepted") ?? 0).toBeGreaterThan(0);
  if (PUSH_RUNS >= 10_000) {
    for (const k of ["accepted", "INVALID_ARGUMENT", "DATA_LOSS", "FAILED_PRECONDITION", "NOT_FOUND", "ALREADY_EXISTS", "CANCELLED"]) {
      expect([k, pushStats.get(k) ?? 0]).not.toEqual([k, 0]);
    }
  }
}, 120_000);
