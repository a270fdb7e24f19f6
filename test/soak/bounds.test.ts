// Resource bounds on the decode side: pushes that never finish, oversized messages on
// gRPC and on the binary data plane, and HTTP clients that never read their stream.
import { afterAll, describe, expect, test } from "bun:test";
import * as net from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { envelopeBytes } from "../../src/codec/index.ts";
import { KvChunkSchema, KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import { buildChunks, kvMessageLimit, TransferError, type KvChunkLike } from "../../src/transfer/index.ts";
import { CHUNK_FIXED, encodeChunk, FRAME_CHUNK, FRAME_HEAD } from "../../src/transfer/wire/index.ts";
import { putU32 } from "../../src/codec/index.ts";
import { startEngineNode } from "../../src/cli/engine-node.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { fakeServedModel, sseEvents, startTestCluster } from "../support/nodes.ts";
import { rawConnect, type RawConn } from "../support/raw-data-plane.ts";
import { prefillTransport, pushTo, SHAPE, settle, snapshot, startDecode, type Decode } from "../transfer/harness.ts";

/** A data plane CHUNK frame, as the frame codec lays it out. */
function chunkFrame(c: KvChunkLike): Uint8Array {
  return encodeChunk(c);
}

/** A prompt of `blocks` full blocks prefilled on a pool of P's, chunked as for a D that holds nothing. */
function pushChunks(P: KvPool, handle: string, blocks: number, seed: number): KvChunkLike[] {
  const pre = fakePrefill(P, fakePrompt(blocks * SHAPE.blockTokens, seed))!;
  const chunks = buildChunks(
    P,
    handle,
    pre.ids,
    pre.hashes,
    pre.hashes.map(() => false),
  ).map((c) => ({ ...c, envelope: c.envelope.slice() }));
  P.releaseAll(pre.ids);
  return chunks;
}

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe("pushes that never finish", () => {
  const CAP = 6;
  const PEERS = 20;

  test("gRPC: refused with RESOURCE_EXHAUSTED past the in-flight cap; D's pool stays bounded; freed when the peer goes", async () => {
    const d = await startDecode("grpc", { blocks: 64, rx: { maxInFlight: CAP } });
    const t = prefillTransport("grpc");
    cleanups.push(
      () => t.close(),
      () => d.close(),
    );
    const P = new KvPool(SHAPE, 256);
    const base = snapshot(d.pool, d.rx);
    // Each peer sends 2 of its 4 chunks, then stalls until told to go.
    let go!: () => void;
    const gone = new Promise<void>((r) => (go = r));
    const outcomes = Array.from({ length: PEERS }, (_, i) => {
      const chunks = pushChunks(P, `stall-${i}`, 4, 100 + i);
      async function* stall() {
        yield chunks[0]!;
        yield chunks[1]!;
        await gone;
      }
      return pushTo(t, d.target, stall()).then(
        () => "accepted",
        (e: unknown) => (e instanceof TransferError ? e.code : `untyped: ${String(e)}`),
      );
    });
    expect(await settle(() => d.rx.inFlight() === CAP && d.pool.used === CAP * 2)).toBe(true);
    // What the stalled peers hold is bounded by the cap, whatever they do.
    expect(d.pool.used).toBe(CAP * 2);
    // A legitimate push meanwhile is refused too (the cap is D's, not per peer), and takes nothing.
    const other = pushChunks(P, "legit", 3, 999);
    expect(await pushTo(t, d.target, other).catch((e: TransferError) => e.code)).toBe(Code.ResourceExhausted);
    go();
    const codes = await Promise.all(outcomes);
    // The refused ones: RESOURCE_EXHAUSTED; the ones in flight end short: INVALID_ARGUMENT. None accepted.
    expect(codes.filter((c) => c === Code.ResourceExhausted).length).toBe(PEERS - CAP);
    expect(codes.filter((c) => c === Code.InvalidArgument).length).toBe(CAP);
    expect(await settle(() => d.rx.inFlight() === 0 && d.pool.used === 0)).toBe(true);
    expect(snapshot(d.pool, d.rx)).toEqual(base);

    // A peer that hangs up (its stream cancelled) instead of ending: freed as well.
    const acs = Array.from({ length: CAP }, () => new AbortController());
    const hung = acs.map((ac, i) => {
      const chunks = pushChunks(P, `hang-${i}`, 4, 200 + i);
      async function* stall() {
        yield chunks[0]!;
        yield chunks[1]!;
        await new Promise<void>((r) => ac.signal.addEventListener("abort", () => r()));
      }
      return pushTo(t, d.target, stall(), { signal: ac.signal }).catch(() => "refused");
    });
    expect(await settle(() => d.rx.inFlight() === CAP)).toBe(true);
    for (const ac of acs) ac.abort();
    await Promise.all(hung);
    expect(await settle(() => d.rx.inFlight() === 0 && d.pool.used === 0)).toBe(true);
    expect(snapshot(d.pool, d.rx)).toEqual(base);
  });

  test("data plane: refused with RESOURCE_EXHAUSTED past the cap; freed when the connection goes or the time to live ends", async () => {
    const d = await startDecode("data-plane", { blocks: 64, rx: { maxInFlight: CAP, ttlMs: 400 } });
    cleanups.push(() => d.close());
    const P = new KvPool(SHAPE, 256);
    const base = snapshot(d.pool, d.rx);
    const dp = d.server.dataPlaneAddress;
    const conns: RawConn[] = [];
    for (let i = 0; i < PEERS; i++) {
      const c = await rawConnect(dp);
      conns.push(c);
      const chunks = pushChunks(P, `dp-stall-${i}`, 4, 300 + i);
      c.socket.write(chunkFrame(chunks[0]!));
      c.socket.write(chunkFrame(chunks[1]!));
      c.socket.flush();
    }
    expect(await settle(() => conns.filter((c) => c.errors.length > 0).length === PEERS - CAP)).toBe(true);
    expect(d.rx.inFlight()).toBe(CAP);
    expect(d.pool.used).toBe(CAP * 2);
    for (const c of conns) for (const e of c.errors) expect([e.code, e.message]).toEqual([Code.ResourceExhausted, expect.stringMatching(/in flight, max 6/)]);
    // Half the stalled peers hang up: their half-pushes are freed at once.
    const stalled = conns.filter((c) => c.errors.length === 0);
    for (const c of stalled.slice(0, CAP / 2)) c.socket.end();
    expect(await settle(() => d.rx.inFlight() === CAP / 2 && d.pool.used === CAP)).toBe(true);
    // The other half keep their connections open and never send again: the time to live frees them (the timer, nobody asking).
    expect(await settle(() => d.pool.used === 0, 3_000)).toBe(true);
    expect(snapshot(d.pool, d.rx)).toEqual(base);
    for (const c of conns) c.socket.end();
  });
});

describe("oversized messages", () => {
  let d: Decode;

  test("gRPC: a message over the limit is refused with RESOURCE_EXHAUSTED and takes nothing", async () => {
    d = await startDecode("grpc", { blocks: 16 });
    cleanups.push(() => d.close());
    const base = snapshot(d.pool, d.rx);
    const limit = kvMessageLimit(d.rx);
    // A raw client with a large write limit: the server's readMaxBytes is what is tested.
    const client = createClient(KvTransfer, createGrpcTransport({ baseUrl: `http://${d.target}`, writeMaxBytes: 64 * 1024 * 1024 }));
    const huge = new Uint8Array(limit + 1);
    async function* one() {
      yield create(KvChunkSchema, { handleId: "huge", index: 0, total: 1, hash: 1n, kvFormat: 1, envelope: huge, crc32c: 0 });
    }
    const err = await client.pushKv(one()).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ConnectError);
    expect([(err as ConnectError).code, (err as ConnectError).rawMessage]).toEqual([Code.ResourceExhausted, expect.stringMatching(/readMaxBytes|larger than/)]);
    // HasBlocks with too many hashes: the same.
    const many = Array.from({ length: limit / 8 + 10 }, (_, i) => BigInt(i + 1));
    const err2 = await client.hasBlocks({ hashes: many, kvFormat: 1 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect((err2 as ConnectError).code).toBe(Code.ResourceExhausted);
    // The largest legal chunk still goes through (the limit is not too tight).
    const P = new KvPool(SHAPE, 8);
    const t = prefillTransport("grpc");
    cleanups.push(() => t.close());
    const ok = await pushTo(t, d.target, pushChunks(P, "fits", 1, 7));
    expect(ok.blocksReceived).toBe(1);
    d.rx.release("fits");
    expect(snapshot(d.pool, d.rx)).toEqual({ ...base, cached: base.cached + 1, free: base.free - 1 });
  });

  test("data plane: a frame length over the limit is refused with RESOURCE_EXHAUSTED before its body arrives", async () => {
    const dd = await startDecode("data-plane", { blocks: 16 });
    cleanups.push(() => dd.close());
    const base = snapshot(dd.pool, dd.rx);
    const maxFrame = FRAME_HEAD + CHUNK_FIXED + 0xffff + envelopeBytes(SHAPE, 1);
    for (const len of [maxFrame - 4 + 1, 0x7fffffff, 0xffffffff]) {
      const c = await rawConnect(dd.server.dataPlaneAddress);
      // Only the 5-byte head: were D waiting to buffer the body, no answer would ever come.
      const head = new Uint8Array(5);
      putU32(head, 0, len);
      head[4] = FRAME_CHUNK;
      c.socket.write(head);
      c.socket.flush();
      expect(await settle(() => c.errors.length > 0, 3_000)).toBe(true);
      expect([len, c.errors[0]!.code, c.errors[0]!.message]).toEqual([len, Code.ResourceExhausted, expect.stringMatching(/limit/)]);
      c.socket.end();
    }
    // A frame at the limit is read in full (and refused for what it says, not its size).
    const c = await rawConnect(dd.server.dataPlaneAddress);
    const P = new KvPool(SHAPE, 8);
    const [chunk] = pushChunks(P, "x".repeat(0xffff), 1, 9);
    const f = chunkFrame({ ...chunk!, crc32c: chunk!.crc32c ^ 1 });
    expect(f.length).toBe(maxFrame);
    c.socket.write(f);
    c.socket.flush();
    expect(await settle(() => c.errors.length > 0, 3_000)).toBe(true);
    expect(c.errors[0]!.code).toBe(Code.DataLoss);
    c.socket.end();
    expect(await settle(() => dd.rx.inFlight() === 0)).toBe(true);
    expect(snapshot(dd.pool, dd.rx)).toEqual(base);
  });
});

describe("slow HTTP clients", () => {
  /** Sends a streaming request over a raw socket and never reads the answer. */
  async function neverReads(address: string, body: unknown): Promise<net.Socket> {
    const i = address.lastIndexOf(":");
    const s = net.connect({ host: address.slice(0, i), port: Number(address.slice(i + 1)) });
    await new Promise<void>((r) => s.once("connect", () => r()));
    s.pause();
    const json = JSON.stringify(body);
    s.write(`POST /v1/completions HTTP/1.1\r\nhost: ${address}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(json)}\r\n\r\n${json}`);
    s.on("error", () => {});
    return s;
  }

  test("clients that never read their SSE stream do not stall the engine loop or the gateway for others", async () => {
    const k = await startTestCluster({ prefill: 1, decode: 1, both: 0 });
    const solo = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 256 });
    cleanups.push(
      () => solo.shutdown(),
      () => k.stop(),
    );
    for (const n of [...k.decode, solo]) (n.model.runner as FakeRunner).slowMs = 1;
    const slowBody = { prompt: "a slow reader ".repeat(8), max_tokens: 380, temperature: 0, stream: true, stream_options: { include_usage: true } };
    const slow: net.Socket[] = [];
    for (let i = 0; i < 6; i++) {
      slow.push(await neverReads(solo.httpAddress, { ...slowBody, seed: i }));
      slow.push(await neverReads(k.gateway.httpAddress, { ...slowBody, seed: i }));
    }
    await settle(() => solo.engine.inFlight === 6 && k.decode[0]!.engine.inFlight === 6);
    // Others are served while those sit, directly and through the gateway, streaming and not.
    for (const addr of [solo.httpAddress, k.gateway.httpAddress]) {
      const res = await Promise.all(
        [0, 1, 2, 3].map((i) =>
          fetch(`http://${addr}/v1/completions`, {
            method: "POST",
            body: JSON.stringify({ prompt: `quick ${i}`, max_tokens: 8, temperature: 0, stream: i % 2 === 0 }),
            signal: AbortSignal.timeout(10_000),
          }),
        ),
      );
      for (const [i, r] of res.entries()) {
        expect(r.status).toBe(200);
        if (i % 2 === 0) expect((await sseEvents(r)).at(-1)).toBe("[DONE]");
        else {
          const j = (await r.json()) as { choices: { finish_reason: string }[]; usage: { completion_tokens: number } };
          // 8 tokens, or fewer when the model sampled its end of sequence.
          expect(j.choices[0]!.finish_reason === "stop" || j.usage.completion_tokens === 8).toBe(true);
        }
      }
    }
    // The slow ones were never blocked either: their generations finish with nobody reading.
    expect(await settle(() => solo.engine.inFlight === 0 && k.decode[0]!.engine.inFlight === 0, 20_000)).toBe(true);
    for (const s of slow) expect(s.destroyed).toBe(false);
    for (const s of slow) s.destroy();
    expect(await settle(() => [solo, ...k.all()].every((n) => n.pool.used === 0 && (n.receiver?.pending() ?? 0) === 0))).toBe(true);
  });
});
