// PushKv over gRPC as Connect serves it (src/transfer/receive/kv-service.ts), driven with
// raw HTTP/2 writes: messages are reassembled whatever the DATA frame boundaries, a
// broken stream is refused with its code and frees what it took, and every protocol
// Connect speaks (gRPC compressed, the Connect protocol) is answered alike.
import { afterAll, expect, test } from "bun:test";
import * as http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, type ConnectError, createClient } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { KvChunkSchema, KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import { buildChunks, type KvChunkLike } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt, kvDigest, patternDigest } from "../support/fake-model.ts";
import { concat } from "../support/raw-data-plane.ts";
import { SHAPE, settle, snapshot, startDecode, type Decode } from "./harness.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

async function decode(): Promise<Decode> {
  const d = await startDecode("grpc", { blocks: 32 });
  cleanups.push(() => d.close());
  return d;
}

/** A prompt's chunks from a prefilled P pool: full blocks and a partial tail. */
function promptChunks(handle: string, nTokens: number): { chunks: KvChunkLike[]; tokens: number[] } {
  const P = new KvPool(SHAPE, 16);
  const tokens = fakePrompt(nTokens, nTokens);
  const { ids, hashes } = fakePrefill(P, tokens)!;
  return {
    chunks: buildChunks(
      P,
      handle,
      ids,
      hashes,
      hashes.map(() => false),
    ).map((c) => ({ ...c, envelope: c.envelope.slice() })),
    tokens,
  };
}

function grpcMessage(c: KvChunkLike, flags = 0): Uint8Array {
  const msg = toBinary(KvChunkSchema, create(KvChunkSchema, c));
  const out = new Uint8Array(5 + msg.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, msg.length);
  out.set(msg, 5);
  return out;
}

/** A raw HTTP/2 PushKv: `body` written in pieces of the given sizes; the status and message from the trailers. */
async function rawPush(target: string, body: Uint8Array, pieces: number[]): Promise<{ status: number; message: string; bytes: number }> {
  const session = http2.connect(`http://${target}`);
  try {
    const req = session.request({ ":method": "POST", ":path": "/tl.kv.v1.KvTransfer/PushKv", "content-type": "application/grpc", te: "trailers" });
    let bytes = 0;
    req.on("data", (b: Uint8Array) => (bytes += b.length));
    const trailers = new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
      req.on("trailers", resolve);
      req.on("error", reject);
    });
    let o = 0;
    for (let k = 0; o < body.length; k++) {
      const n = pieces[k % pieces.length]!;
      req.write(body.subarray(o, Math.min(body.length, o + n)));
      o += n;
      if (k % 3 === 0) await Bun.sleep(1);
    }
    req.end();
    const t = await trailers;
    return { status: Number(t["grpc-status"]), message: decodeURIComponent(String(t["grpc-message"] ?? "")), bytes };
  } finally {
    session.close();
  }
}

test("grpc push reassembles split messages", async () => {
  const d = await decode();
  const { chunks, tokens } = promptChunks("split", 4 * SHAPE.blockTokens + 3);
  const body = concat(...chunks.map((c) => grpcMessage(c)));
  // Prefixes and messages cut at odd places, and the whole stream in one write.
  for (const pieces of [[3], [1, 7, 40, 2], [body.length]]) {
    const r = await rawPush(d.target, body, pieces);
    expect([pieces.join(","), r.status, r.message]).toEqual([pieces.join(","), 0, ""]);
    expect(r.bytes).toBeGreaterThan(5); // the KvAck message
    const h = d.rx.claim("split")!;
    expect(h.nTokens).toBe(tokens.length);
    expect(kvDigest(d.pool, h.blockIds, h.nTokens)).toBe(patternDigest(SHAPE, tokens));
    d.pool.releaseAll(h.blockIds);
  }
});

test("grpc push refuses broken streams and frees", async () => {
  const d = await decode();
  const base = snapshot(d.pool, d.rx);
  const { chunks } = promptChunks("broken", 3 * SHAPE.blockTokens + 1);
  const whole = chunks.map((c) => grpcMessage(c));
  const cases: [string, Uint8Array, number, RegExp][] = [
    // Two chunks taken, then the stream ends inside the third message.
    ["ends inside a message", concat(whole[0]!, whole[1]!, whole[2]!.subarray(0, 100)), Code.InvalidArgument, /incomplete envelope/],
    ["ends inside a prefix", concat(whole[0]!, whole[1]!.subarray(0, 3)), Code.InvalidArgument, /incomplete envelope/],
    ["compressed flag without an encoding", concat(whole[0]!, grpcMessage(chunks[1]!, 1)), Code.Internal, /compressed/],
    // gRPC's code for a message that does not parse (grpc-go's and Connect's alike).
    ["not a KvChunk", concat(whole[0]!, Uint8Array.of(0, 0, 0, 0, 2, 0x0a, 0x7f)), Code.Internal, /premature EOF/],
    ["short of total", concat(...whole.slice(0, 3)), Code.InvalidArgument, /ended after 3 of 4 chunks/],
    ["empty", new Uint8Array(0), Code.InvalidArgument, /empty push/],
  ];
  for (const [what, body, code, message] of cases) {
    const r = await rawPush(d.target, body, [1000]);
    expect([what, r.status, r.message]).toEqual([what, code, expect.stringMatching(message)]);
    expect(await settle(() => snapshot(d.pool, d.rx).used === base.used)).toBe(true);
    expect([what, snapshot(d.pool, d.rx)]).toEqual([what, base]);
  }
});

test("push kv over every connect protocol", async () => {
  const d = await decode();
  const { chunks, tokens } = promptChunks("fallback", 2 * SHAPE.blockTokens + 5);
  const transports = {
    "gRPC, gzip": createGrpcTransport({ baseUrl: `http://${d.target}`, sendCompression: compressionGzip }),
    "Connect protocol": createConnectTransport({ baseUrl: `http://${d.target}`, httpVersion: "2" }),
  };
  for (const [what, transport] of Object.entries(transports)) {
    const client = createClient(KvTransfer, transport);
    async function* stream() {
      for (const c of chunks) yield create(KvChunkSchema, c);
    }
    const ack = await client.pushKv(stream());
    expect([what, ack.blocksReceived, ack.nTokens]).toEqual([what, chunks.length, tokens.length]);
    const h = d.rx.claim("fallback")!;
    expect(kvDigest(d.pool, h.blockIds, h.nTokens)).toBe(patternDigest(SHAPE, tokens));
    d.pool.releaseAll(h.blockIds);
    // And a refusal there keeps its code.
    async function* bad() {
      yield create(KvChunkSchema, { ...chunks[0]!, crc32c: chunks[0]!.crc32c ^ 1 });
    }
    const err = await client.pushKv(bad()).then(
      () => null,
      (e: unknown) => e,
    );
    expect([what, (err as ConnectError).code]).toEqual([what, Code.DataLoss]);
  }
});
