// A refusal before any handler (a certificate of the wrong role, none at all on a plaintext
// port's policy) is a trailers-only gRPC response every client reads: grpc-js, which took the
// old reply (headers, then the stream reset with NO_ERROR) for INTERNAL "RST_STREAM code 0",
// must see PERMISSION_DENIED with the server's message, on unary and client-streaming calls alike.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { serveGrpc, type GrpcServer } from "../../src/rpc/grpc-server.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";
import { TlsSource } from "../../src/rpc/tls-config.ts";
import { testPki, type TestPki } from "../support/certs.ts";

const PROTO_ROOT = join(import.meta.dir, "../../proto");
type Cb = (err: grpc.ServiceError | null, res: unknown) => void;
interface Clients {
  control: grpc.Client & { Drain(req: object, cb: Cb): void; Info(req: object, cb: Cb): void };
  kv: grpc.Client & { PushKv(cb: Cb): grpc.ClientWritableStream<object>; HasBlocks(req: object, cb: Cb): void };
}

let pki: TestPki;
let server: GrpcServer;
let handled = 0;
beforeAll(async () => {
  pki = await testPki();
  server = await serveGrpc(
    (r) => {
      r.service(EngineControl, { info: () => ({ workerId: "x" }), drain: () => (handled++, {}) });
      r.service(KvTransfer, { hasBlocks: () => (handled++, { present: [] }), pushKv: async () => (handled++, {}) } as never);
    },
    { tls: new TlsSource(pki.files("decode")) },
  );
});
afterAll(() => server.close());

function clients(role: PeerRole): Clients {
  const files = pki.files(role);
  const creds = grpc.credentials.createSsl(readFileSync(files.ca), readFileSync(files.key), readFileSync(files.cert), {
    // The server's name is its SPIFFE URI, not a host name: the CA is what is checked here.
    checkServerIdentity: () => undefined,
  });
  const load = (file: string) =>
    grpc.loadPackageDefinition(protoLoader.loadSync(file, { includeDirs: [PROTO_ROOT], keepCase: true, longs: String, defaults: true })) as unknown as {
      tl: { engine: { v1: Record<string, grpc.ServiceClientConstructor> }; kv: { v1: Record<string, grpc.ServiceClientConstructor> } };
    };
  const addr = `127.0.0.1:${server.port}`;
  // TLS takes no IP address as a server name.
  const opts = { "grpc.ssl_target_name_override": "tl-engine" };
  return {
    control: new (load("tl/engine/v1/engine.proto").tl.engine.v1.EngineControl!)(addr, creds, opts) as unknown as Clients["control"],
    kv: new (load("tl/kv/v1/kv.proto").tl.kv.v1.KvTransfer!)(addr, creds, opts) as unknown as Clients["kv"],
  };
}

const outcome = (f: (cb: Cb) => void) =>
  new Promise<{ code: number; details: string }>((resolve) => f((e) => resolve(e ? { code: e.code, details: e.details } : { code: 0, details: "" })));

test("a valid certificate of the wrong role: grpc-js reads PERMISSION_DENIED and the reason, unary and streaming", async () => {
  const c = clients("prefill");
  try {
    for (let i = 0; i < 3; i++) {
      // Drain is the gateway's (or an admin's); HasBlocks and PushKv a prefill engine's, not a decode engine's.
      const drain = await outcome((cb) => c.control.Drain({}, cb));
      expect(drain).toEqual({ code: grpc.status.PERMISSION_DENIED, details: expect.any(String) });
      expect(drain.details).toContain("prefill");
    }
    const g = clients("decode");
    try {
      const has = await outcome((cb) => g.kv.HasBlocks({ hashes: [], kv_format: 1 }, cb));
      expect(has.code).toBe(grpc.status.PERMISSION_DENIED);
      // A client stream still open when the refusal comes.
      const push = await outcome((cb) => {
        const w = g.kv.PushKv(cb);
        w.write({ handle_id: "h", index: 0, total: 2, hash: "1", kv_format: 1, envelope: Buffer.alloc(64 * 1024), crc32c: 0 });
      });
      expect(push.code).toBe(grpc.status.PERMISSION_DENIED);
      const ended = await outcome((cb) => {
        const w = g.kv.PushKv(cb);
        w.end();
      });
      expect(ended.code).toBe(grpc.status.PERMISSION_DENIED);
    } finally {
      g.control.close();
      g.kv.close();
    }
    // Method names a plain object would find on Object.prototype: refused like any unknown method.
    for (const name of ["/__proto__", "/constructor", "/hasOwnProperty", "/tl.kv.v1.KvTransfer/constructor"]) {
      const r = await outcome((cb) =>
        c.kv.makeUnaryRequest(
          name,
          (x: Buffer) => x,
          (x: Buffer) => x,
          Buffer.alloc(0),
          cb,
        ),
      );
      expect({ name, code: r.code }).toEqual({ name, code: grpc.status.PERMISSION_DENIED });
      expect(r.details).toContain("not open to any peer");
    }
    expect(handled).toBe(0);
    // The role the method is open to gets through on the same server.
    expect((await outcome((cb) => c.kv.HasBlocks({ hashes: [], kv_format: 1 }, cb))).code).toBe(grpc.status.OK);
  } finally {
    c.control.close();
    c.kv.close();
  }
});
