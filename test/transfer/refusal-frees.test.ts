// A refusal after D took at least one block of the push, on the paths the other tests
// leave out: PushKv through Connect's own clients (every protocol it serves) and the
// data plane's CHUNK frames written by hand. D's pool and in-flight state after the
// refusal equal those before the push. (Raw gRPC streams: push-kv-grpc.test.ts; the
// transport's pushes: kv-transfer.test.ts; RUN frames: data-plane-run.test.ts.)
import { afterAll, beforeAll, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { KvChunkSchema, KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import { encodeChunk } from "../../src/transfer/wire/index.ts";
import { buildChunks, type KvChunkLike } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { rawConnect, writeAll } from "../support/raw-data-plane.ts";
import { SHAPE, settle, snapshot, startDecode, type Decode } from "./harness.ts";

let d: Decode;
beforeAll(async () => {
  d = await startDecode("data-plane", { blocks: 32 });
});
afterAll(async () => {
  await d?.close();
});

let n = 0;
/** A fresh prompt's chunks (4 full blocks and a tail), none deduplicated. */
function chunks(): KvChunkLike[] {
  const P = new KvPool(SHAPE, 16);
  const { ids, hashes } = fakePrefill(P, fakePrompt(4 * SHAPE.blockTokens + 2, 100 + n++))!;
  const out = buildChunks(
    P,
    `refused-${n}`,
    ids,
    hashes,
    hashes.map(() => false),
  ).map((c) => ({ ...c, envelope: c.envelope.slice() }));
  return out;
}

/** Resolves once D holds more blocks than at `base` (the push's first blocks were taken). */
async function tookBlocks(base: number): Promise<void> {
  expect(await settle(() => d.pool.used > base, 3000)).toBe(true);
}

test("PushKv through Connect (gzip gRPC, the Connect protocol): refused after blocks were taken, D is as before", async () => {
  const transports: Record<string, Transport> = {
    "gRPC, gzip": createGrpcTransport({ baseUrl: `http://${d.target}`, sendCompression: compressionGzip }),
    "Connect protocol": createConnectTransport({ baseUrl: `http://${d.target}`, httpVersion: "2" }),
  };
  const edits: [string, Code, (c: KvChunkLike[]) => KvChunkLike[]][] = [
    ["bad chunk crc", Code.DataLoss, (c) => ((c[2]!.crc32c ^= 1), c)],
    ["mismatched handle", Code.InvalidArgument, (c) => ((c[2]!.handleId = "other"), c)],
    ["ends early", Code.InvalidArgument, (c) => c.slice(0, 3)],
  ];
  for (const [via, transport] of Object.entries(transports)) {
    const client = createClient(KvTransfer, transport);
    for (const [what, code, edit] of edits) {
      const base = snapshot(d.pool, d.rx);
      const sent = edit(chunks());
      async function* stream() {
        for (const [i, c] of sent.entries()) {
          // The refused part goes only once D has taken the first two blocks.
          if (i === 2) await tookBlocks(base.used);
          yield create(KvChunkSchema, c);
        }
        if (sent.length === 3) await tookBlocks(base.used);
      }
      const err = await client.pushKv(stream()).then(
        () => null,
        (e: unknown) => e,
      );
      expect([via, what, ConnectError.from(err).code]).toEqual([via, what, code]);
      await settle(() => d.pool.used === base.used && d.rx.inFlight() === base.inFlight, 3000);
      expect([via, what, snapshot(d.pool, d.rx)]).toEqual([via, what, base]);
    }
  }
});

test("data plane CHUNK frames: refused after blocks were taken, D is as before", async () => {
  const edits: [string, Code, (c: KvChunkLike) => KvChunkLike][] = [
    ["bad chunk crc", Code.DataLoss, (c) => ({ ...c, crc32c: c.crc32c ^ 1 })],
    ["out-of-order index", Code.InvalidArgument, (c) => ({ ...c, index: 4 })],
    ["mismatched total", Code.InvalidArgument, (c) => ({ ...c, total: 3 })],
  ];
  for (const [what, code, edit] of edits) {
    const base = snapshot(d.pool, d.rx);
    const c = chunks();
    const conn = await rawConnect(d.server.dataPlaneAddress);
    try {
      await writeAll(conn.socket, encodeChunk(c[0]!));
      await writeAll(conn.socket, encodeChunk(c[1]!));
      await tookBlocks(base.used);
      await writeAll(conn.socket, encodeChunk(edit(c[2]!)));
      expect(await settle(() => conn.errors.length > 0, 3000)).toBe(true);
      expect([what, conn.errors[0]!.code, conn.acks.length]).toEqual([what, code, 0]);
      await settle(() => d.pool.used === base.used && d.rx.inFlight() === base.inFlight, 3000);
      expect([what, snapshot(d.pool, d.rx)]).toEqual([what, base]);
    } finally {
      conn.socket.end();
    }
  }
});
