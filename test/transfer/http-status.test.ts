// A decode engine's KvTransfer port answered by something that is not a gRPC server (a
// proxy, a misrouted port): an HTTP status with no grpc-status. The push and HasBlocks
// fail with gRPC's code for that status (doc/http-grpc-status-mapping.md in grpc/grpc),
// and the rest of the statuses with UNKNOWN, as TransferErrors.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as http2 from "node:http2";
import { KvPool } from "../../src/pool/index.ts";
import { Code } from "../../src/rpc/status.ts";
import { buildChunks, RoutingTransport, TransferError } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { SHAPE } from "./harness.ts";

let server: http2.Http2Server;
let target = "";
/** What the server answers every request with. */
let status = 503;
beforeAll(async () => {
  server = http2.createServer((req, res) => {
    req.resume();
    res.writeHead(status, { "content-type": "text/plain" });
    res.end("not a gRPC server");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  target = `127.0.0.1:${(server.address() as { port: number }).port}`;
});
afterAll(() => {
  server.close();
});

async function failure(call: "push" | "hasBlocks"): Promise<TransferError> {
  const t = new RoutingTransport({ dataPlane: false, timeoutMs: 5_000 });
  try {
    const P = new KvPool(SHAPE, 8);
    const { ids, hashes } = fakePrefill(P, fakePrompt(2 * SHAPE.blockTokens, 7))!;
    const chunks = buildChunks(
      P,
      "h",
      ids,
      hashes,
      hashes.map(() => false),
    );
    const p = call === "push" ? t.push({ target, via: "grpc" }, chunks) : t.hasBlocks(target, hashes, 1);
    const e = await p.then(
      () => null,
      (e: unknown) => e,
    );
    expect(e).toBeInstanceOf(TransferError);
    return e as TransferError;
  } finally {
    await t.close();
  }
}

test("http status without grpc status maps to its grpc code", async () => {
  const want: [number, Code][] = [
    [400, Code.Internal],
    [401, Code.Unauthenticated],
    [403, Code.PermissionDenied],
    [404, Code.Unimplemented],
    [429, Code.Unavailable],
    [502, Code.Unavailable],
    [503, Code.Unavailable],
    [504, Code.Unavailable],
    [418, Code.Unknown],
  ];
  for (const call of ["push", "hasBlocks"] as const) {
    for (const [answer, code] of want) {
      status = answer;
      const e = await failure(call);
      expect([call, answer, Code[e.code]]).toEqual([call, answer, Code[code]]);
    }
  }
});
