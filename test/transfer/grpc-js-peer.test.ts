// Another gRPC implementation, built only from the project's .proto files, against the
// Connect server: the wire contract, not our client, is what must agree.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { join } from "node:path";
import { KvPool } from "../../src/pool/index.ts";
import { buildChunks } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt, kvDigest, patternDigest } from "../support/fake-model.ts";
import { SHAPE, snapshot, startDecode, type Decode } from "./harness.ts";

const PROTO_ROOT = join(import.meta.dir, "../../proto");

type Cb<T> = (err: grpc.ServiceError | null, res: T) => void;
interface KvTransferClient extends grpc.Client {
  HasBlocks(req: object, cb: Cb<{ present: boolean[]; data_plane_address: string }>): void;
  PushKv(
    cb: Cb<{ handle_id: string; blocks_received: number; blocks_deduped: number; payload_bytes: string; n_tokens: number }>,
  ): grpc.ClientWritableStream<object>;
  Release(req: object, cb: Cb<{ released: boolean }>): void;
}

/** A chunk as grpc-js's proto-loader wants it (keepCase, u64 as a string); `crcXor` flips bits of its CRC. */
function grpcJsChunk(c: ReturnType<typeof buildChunks>[number], crcXor = 0): object {
  const { handleId, index, total, hash, kvFormat, envelope, crc32c } = c;
  return { handle_id: handleId, index, total, hash: hash.toString(), kv_format: kvFormat, envelope: Buffer.from(envelope), crc32c: (crc32c ^ crcXor) >>> 0 };
}

let d: Decode;
let client: KvTransferClient;
beforeAll(async () => {
  d = await startDecode("data-plane");
  const def = protoLoader.loadSync("tl/kv/v1/kv.proto", { includeDirs: [PROTO_ROOT], keepCase: true, longs: String, defaults: true });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    tl: { kv: { v1: { KvTransfer: new (addr: string, creds: grpc.ChannelCredentials) => KvTransferClient } } };
  };
  client = new pkg.tl.kv.v1.KvTransfer(d.target, grpc.credentials.createInsecure());
});
afterAll(async () => {
  client.close();
  await d.close();
});

const call = <T>(f: (cb: Cb<T>) => void) => new Promise<T>((resolve, reject) => f((e, r) => (e ? reject(e) : resolve(r))));

test("grpc js peer interoperates", async () => {
  const P = new KvPool(SHAPE, 16);
  const tokens = fakePrompt(9, 81);
  const warm = fakePrefill(d.pool, tokens.slice(0, 4))!;
  d.pool.releaseAll(warm.ids);
  const pre = fakePrefill(P, tokens)!;
  const hex = pre.hashes.map((h) => h.toString());

  const has = await call<{ present: boolean[]; data_plane_address: string }>((cb) => client.HasBlocks({ hashes: hex, kv_format: 1 }, cb));
  expect(has.present).toEqual([true, false]);
  expect(has.data_plane_address).toBe(d.server.dataPlaneAddress);
  const bad = await call((cb) => client.HasBlocks({ hashes: hex, kv_format: 2 }, cb)).catch((e: grpc.ServiceError) => e);
  expect((bad as grpc.ServiceError).code).toBe(grpc.status.FAILED_PRECONDITION);

  const chunks = buildChunks(P, "from-grpc-js", pre.ids, pre.hashes, has.present);
  const ack = await call<{ handle_id: string; blocks_received: number; blocks_deduped: number; payload_bytes: string; n_tokens: number }>((cb) => {
    const w = client.PushKv(cb);
    for (const c of chunks) {
      w.write(grpcJsChunk(c));
    }
    w.end();
  });
  expect(ack).toEqual({ handle_id: "from-grpc-js", blocks_received: 2, blocks_deduped: 1, payload_bytes: String(2 * 172), n_tokens: 9 });
  expect(d.rx.pending()).toBe(1);

  // a refusal reaches grpc-js with its status, and D is left as it was
  const before = snapshot(d.pool, d.rx);
  const refused = await call((cb) => {
    const w = client.PushKv(cb);
    for (const c of buildChunks(P, "bad", pre.ids, pre.hashes, has.present)) w.write(grpcJsChunk(c, c.index === 2 ? 1 : 0));
    w.end();
  }).catch((e: grpc.ServiceError) => e);
  expect((refused as grpc.ServiceError).code).toBe(grpc.status.DATA_LOSS);
  // Connect percent-encodes grpc-message fully; grpc-js decodes it with decodeURI, which keeps %3A, %2C.
  expect(decodeURIComponent((refused as grpc.ServiceError).details)).toMatch(/crc mismatch: got 0x[0-9a-f]{8}, want 0x[0-9a-f]{8}/);
  expect(snapshot(d.pool, d.rx)).toEqual(before);

  const held = d.rx.claim("from-grpc-js")!;
  expect(kvDigest(d.pool, held.blockIds, held.nTokens)).toBe(patternDigest(SHAPE, tokens));
  // give the handle back so Release has something to free
  d.pool.releaseAll(held.blockIds);
  const again = fakePrefill(P, tokens, { reusePrefix: true })!;
  P.releaseAll(pre.ids);
  await call((cb) => {
    const w = client.PushKv(cb);
    for (const c of buildChunks(P, "to-release", again.ids, again.hashes, [true, true])) w.write(grpcJsChunk(c));
    w.end();
  });
  expect(await call<{ released: boolean }>((cb) => client.Release({ handle_id: "to-release" }, cb))).toEqual({ released: true });
  expect(await call<{ released: boolean }>((cb) => client.Release({ handle_id: "to-release" }, cb))).toEqual({ released: false });
  expect(await call<{ released: boolean }>((cb) => client.Release({ handle_id: "unknown" }, cb))).toEqual({ released: false });
  expect(d.rx.pending()).toBe(0);
  expect(d.pool.used).toBe(0);
  P.releaseAll(again.ids);
});
