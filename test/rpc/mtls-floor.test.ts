// The rpc floor's mTLS pieces on their own: serveGrpc over mTLS with the role check, the
// client's server check, and the Bun socket helpers the data plane uses.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type * as http2 from "node:http2";
import { serveGrpc, type GrpcServer } from "../../src/rpc/grpc-server.ts";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { callerOf } from "../../src/rpc/peer-gate.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";
import { DATA_PLANE_PUSH, DECODE_TARGET_ROLES } from "../../src/rpc/peer-policy.ts";
import { admitBunPeer, bunDial, bunServerTls } from "../../src/rpc/bun-tls.ts";
import { secureSessionOptions } from "../../src/rpc/tls-client.ts";
import { clientTlsOptions, TlsSource, type TlsMaterial } from "../../src/rpc/tls-config.ts";
import { testPki, type TestPki } from "../support/certs.ts";

let pki: TestPki;
let server: GrpcServer;
let port = 0;
const calls: string[] = [];
beforeAll(async () => {
  pki = await testPki();
  server = await serveGrpc(
    (r) =>
      r.service(EngineControl, {
        info: (_req, ctx) => {
          const c = callerOf(ctx);
          calls.push(`info ${c?.role}`);
          return { workerId: `${c?.role}/${c?.workerId}` };
        },
        drain: (_req, ctx) => {
          calls.push(`drain ${callerOf(ctx)?.role}`);
          return {};
        },
      }),
    { tls: new TlsSource(pki.files("prefill")) },
  );
  port = server.port;
});
afterAll(() => server.close());

function client(nodeOptions: http2.SecureClientSessionOptions) {
  const baseUrl = `https://127.0.0.1:${port}`;
  return createClient(EngineControl, createGrpcTransport({ baseUrl, sessionManager: new Http2SessionManager(baseUrl, undefined, nodeOptions) }));
}
const as = (role: PeerRole, expect?: readonly PeerRole[]) =>
  client(secureSessionOptions({ source: new TlsSource(pki.files(role)), expect }, `127.0.0.1:${port}`));
const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => "ok",
    (e: unknown) => (e instanceof ConnectError ? Code[e.code] : String(e)),
  );
const raw = (m: Partial<TlsMaterial>) =>
  client({ ...clientTlsOptions({ ...pki.material("gateway"), ...m } as TlsMaterial), cert: m.cert, key: m.key } as http2.SecureClientSessionOptions);

test("grpc server checks roles before the handler", async () => {
  calls.length = 0;
  expect((await as("decode").info({})).workerId).toBe("decode/decode-0");
  expect(await codeOf(as("decode").drain({}))).toBe("PermissionDenied");
  const denied = await as("prefill")
    .drain({})
    .catch((e: ConnectError) => e);
  expect((denied as ConnectError).rawMessage).toBe("tl.engine.v1.EngineControl/Drain: role prefill may not call it (allowed: gateway, admin)");
  expect(await codeOf(as("gateway").drain({}))).toBe("ok");
  expect(await codeOf(as("admin").drain({}))).toBe("ok");
  expect(calls).toEqual(["info decode", "drain gateway", "drain admin"]);
});

test("grpc server refuses strangers at the handshake", async () => {
  calls.length = 0;
  // no certificate, a stranger's certificate (trusting our CA), plaintext h2c
  expect(await codeOf(raw({ cert: undefined, key: undefined }).info({}, { timeoutMs: 3000 }))).not.toBe("ok");
  const s = pki.stranger("gateway");
  expect(await codeOf(raw({ cert: s.cert, key: s.key }).drain({}, { timeoutMs: 3000 }))).not.toBe("ok");
  const h2c = createClient(EngineControl, createGrpcTransport({ baseUrl: `http://127.0.0.1:${port}` }));
  expect(await codeOf(h2c.info({}, { timeoutMs: 3000 }))).not.toBe("ok");
  expect(calls).toEqual([]);
});

test("grpc client checks the server role", async () => {
  // The server holds a prefill certificate: a client that wants a decode engine stops at the handshake.
  const e = await as("gateway", DECODE_TARGET_ROLES)
    .info({})
    .catch((err: ConnectError) => err);
  expect(e).toBeInstanceOf(ConnectError);
  expect((e as ConnectError).message).toContain(`127.0.0.1:${port} is prefill/prefill-0, not one of decode, both`);
  expect(await codeOf(as("gateway", ["prefill", "both"]).info({}))).toBe("ok");
});

test("bun sockets check both ends", async () => {
  const seen: string[] = [];
  const listener = Bun.listen<undefined>({
    hostname: "127.0.0.1",
    port: 0,
    tls: bunServerTls(new TlsSource(pki.files("decode"))),
    socket: {
      handshake(s) {
        const why = admitBunPeer(s, DATA_PLANE_PUSH);
        seen.push(why ?? "admitted");
        if (why !== null) s.end();
      },
      data(s) {
        s.write("ack");
      },
    },
  });
  const dial = async (role: PeerRole, expect: readonly PeerRole[]) => {
    const d = bunDial(new TlsSource(pki.files(role)), `127.0.0.1:${listener.port}`, expect);
    let got = "";
    const sock = await Bun.connect({
      hostname: "127.0.0.1",
      port: listener.port,
      tls: d.tls,
      socket: { handshake: (s, ok, err) => d.onHandshake(s, ok, err), data: (_s, b) => void (got += Buffer.from(b).toString()) },
    });
    try {
      await d.verified;
      sock.write("push");
      for (let i = 0; i < 100 && got === ""; i++) await Bun.sleep(10);
      return got || "closed";
    } catch (e) {
      return (e as Error).message;
    } finally {
      sock.end();
    }
  };
  expect(await dial("prefill", DECODE_TARGET_ROLES)).toBe("ack");
  expect(await dial("both", DECODE_TARGET_ROLES)).toBe("ack");
  expect(await dial("gateway", DECODE_TARGET_ROLES)).toBe("closed");
  // the client refuses a server of the wrong role before it writes a byte
  expect(await dial("prefill", ["prefill"])).toMatch(/is decode\/decode-0, not one of prefill/);
  expect(seen.slice(0, 3)).toEqual(["admitted", "admitted", "tl.kv.v1.DataPlane/Push: role gateway may not call it (allowed: prefill, both)"]);
  listener.stop(true);
});
