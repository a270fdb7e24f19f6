// A cluster on mutual TLS, attacked from outside and from inside: every internal port
// refuses a client without a cluster certificate, with another CA's, or with a cluster
// certificate of a role the method is not open to, and nothing changes when it does.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { DescService } from "@bufbuild/protobuf";
import { createServer, type Server } from "node:net";
import { KV_FORMAT } from "../../src/codec/index.ts";
import { Role, WorkerRegistry, WorkerStatusSchema } from "../../src/gen/tl/control/v1/control_pb.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";
import { CLUSTER_TLS_NAME, TlsSource, type TlsMaterial } from "../../src/rpc/tls-config.ts";
import { buildChunks, DataPlaneClient, RoutingTransport, transfer } from "../../src/transfer/index.ts";
import { testPki, type TestPki } from "../support/certs.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

let pki: TestPki;
let c: TestCluster;
beforeAll(async () => {
  pki = await testPki();
  c = await startTestCluster({ prefill: 1, decode: 1, pki });
});
afterAll(async () => {
  await c?.stop();
});

type Who = "none" | "stranger" | PeerRole;
const sessions: Http2SessionManager[] = [];
afterAll(() => {
  for (const s of sessions) s.abort();
});

/** A gRPC client presenting `who`'s certificate (none, another CA's, or a cluster role's). */
function clientAs<T extends DescService>(service: T, target: string, who: Who): Client<T> {
  const ours = pki.material("gateway");
  const m: Partial<TlsMaterial> = who === "none" ? {} : who === "stranger" ? pki.stranger("gateway") : pki.material(who);
  const baseUrl = `https://${target}`;
  const session = new Http2SessionManager(baseUrl, undefined, { ca: ours.ca, cert: m.cert, key: m.key, servername: CLUSTER_TLS_NAME });
  sessions.push(session);
  return createClient(service, createGrpcTransport({ baseUrl, sessionManager: session, defaultTimeoutMs: 5000 }));
}
const plaintext = <T extends DescService>(service: T, target: string) =>
  createClient(service, createGrpcTransport({ baseUrl: `http://${target}`, defaultTimeoutMs: 3000 }));

const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => "ok",
    (e: unknown) => (e instanceof ConnectError ? Code[e.code] : `threw ${String(e)}`),
  );
const refusedAtHandshake = async (p: Promise<unknown>) => expect(await codeOf(p)).toMatch(/^(Unavailable|Canceled|Internal|Unknown|DeadlineExceeded)$/);

function snapshot() {
  return {
    workers: c.gateway.registry
      .list()
      .map((w) => `${w.status.workerId}:${Role[w.status.role]}:${w.status.draining}`)
      .sort(),
    // blocks in use (a refused prefill may leave its prompt in P's prefix cache, as any finished one does)
    pools: c.all().map((n) => `${n.workerId}:${n.pool.used}`),
    pending: c.decode[0]!.receiver!.pending(),
    draining: c.all().map((n) => n.engine.isDraining),
  };
}

const P = () => c.prefill[0]!;
const D = () => c.decode[0]!;
const beat = (workerId: string, role: Role) =>
  create(WorkerStatusSchema, {
    workerId,
    role,
    kvFormat: KV_FORMAT,
    httpAddress: "10.9.9.9:1",
    grpcAddress: "10.9.9.9:2",
    kvAddress: "10.9.9.9:3",
    model: "fake",
    blockTokens: 4,
    totalBlocks: 256,
  });

/** A data-plane connection presenting `who`: what came back before the server hung up. */
async function dataPlaneAs(who: Who): Promise<"admitted" | "refused"> {
  const address = await dpAddress();
  const [host, port] = [address.slice(0, address.lastIndexOf(":")), Number(address.slice(address.lastIndexOf(":") + 1))];
  const m: Partial<TlsMaterial> = who === "none" ? {} : who === "stranger" ? pki.stranger("prefill") : pki.material(who);
  let closed = false;
  let verified = false;
  const sock = await Bun.connect({
    hostname: host,
    port,
    tls: { ca: pki.material("gateway").ca, cert: m.cert, key: m.key, serverName: CLUSTER_TLS_NAME },
    socket: {
      handshake: (_s, ok) => void (verified = ok),
      data: () => {},
      close: () => void (closed = true),
      error: () => void (closed = true),
    },
  });
  // An END frame for a handle never begun: an admitted connection answers it, a refused one is cut.
  for (let i = 0; i < 50 && !closed; i++) await Bun.sleep(10);
  sock.end();
  return closed || !verified ? "refused" : "admitted";
}
/** The data plane D advertises in its HasBlocks answer. */
async function dpAddress(): Promise<string> {
  const res = await clientAs(KvTransfer, D().kvAddress, "prefill").hasBlocks({ hashes: [1n], kvFormat: KV_FORMAT });
  expect(res.dataPlaneAddress).not.toBe("");
  return res.dataPlaneAddress;
}

describe("mTLS cluster (1 prefill + 1 decode)", () => {
  test("the openai path still works through the gateway", async () => {
    const res = await fetch(`http://${c.gateway.httpAddress}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: "The quick brown fox jumps", max_tokens: 6, temperature: 0 }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-tl-served")).toBe("disaggregated");
    expect(Number(res.headers.get("x-tl-blocks-sent"))).toBeGreaterThan(0);
  });

  test("internal ports refuse strangers", async () => {
    const before = snapshot();
    const reg = c.gateway.registryAddress;
    // registry: Heartbeat
    for (const who of ["none", "stranger"] as const) await refusedAtHandshake(clientAs(WorkerRegistry, reg, who).heartbeat(beat("decode-0", Role.DECODE)));
    await refusedAtHandshake(plaintext(WorkerRegistry, reg).heartbeat(beat("x", Role.DECODE)));
    expect(await codeOf(clientAs(WorkerRegistry, reg, "gateway").heartbeat(beat("gateway-0", Role.DECODE)))).toBe("PermissionDenied");
    expect(await codeOf(clientAs(WorkerRegistry, reg, "admin").heartbeat(beat("admin-0", Role.DECODE)))).toBe("PermissionDenied");
    // EngineControl on both engines: Drain and Cancel
    for (const n of [P(), D()]) {
      for (const who of ["none", "stranger"] as const) await refusedAtHandshake(clientAs(EngineControl, n.grpcAddress, who).drain({ deadlineMs: 0n }));
      await refusedAtHandshake(plaintext(EngineControl, n.grpcAddress).drain({ deadlineMs: 0n }));
      for (const who of ["prefill", "decode", "both"] as const) {
        expect(await codeOf(clientAs(EngineControl, n.grpcAddress, who).drain({ deadlineMs: 0n }))).toBe("PermissionDenied");
        expect(await codeOf(clientAs(EngineControl, n.grpcAddress, who).cancel({ requestId: "any" }))).toBe("PermissionDenied");
      }
    }
    // KvTransfer: HasBlocks, PushKv and Release
    const kv = D().kvAddress;
    for (const who of ["none", "stranger"] as const) await refusedAtHandshake(clientAs(KvTransfer, kv, who).hasBlocks({ hashes: [1n], kvFormat: KV_FORMAT }));
    await refusedAtHandshake(plaintext(KvTransfer, kv).hasBlocks({ hashes: [1n], kvFormat: KV_FORMAT }));
    for (const who of ["decode", "admin"] as const) {
      expect(await codeOf(clientAs(KvTransfer, kv, who).hasBlocks({ hashes: [1n], kvFormat: KV_FORMAT }))).toBe("PermissionDenied");
      expect(await codeOf(clientAs(KvTransfer, kv, who).release({ handleId: "h" }))).toBe("PermissionDenied");
    }
    // the data plane
    for (const who of ["none", "stranger", "gateway", "decode", "admin"] as const)
      expect({ who, got: await dataPlaneAs(who) }).toEqual({ who, got: "refused" });
    expect(await dataPlaneAs("prefill")).toBe("admitted");
    expect(snapshot()).toEqual(before);
  });

  test("fake worker cannot register", async () => {
    const before = snapshot();
    const reg = c.gateway.registryAddress;
    // a real prefill certificate posing as a decode worker (to be sent users' prompts and handles)
    const posing = await clientAs(WorkerRegistry, reg, "prefill")
      .heartbeat(beat("prefill-0", Role.DECODE))
      .catch((e: ConnectError) => e);
    expect((posing as ConnectError).code).toBe(Code.PermissionDenied);
    expect((posing as ConnectError).rawMessage).toMatch(/role DECODE differs from its certificate's prefill/);
    // speaking for another worker id
    const other = await clientAs(WorkerRegistry, reg, "decode")
      .heartbeat(beat("decode-7", Role.DECODE))
      .catch((e: ConnectError) => e);
    expect((other as ConnectError).rawMessage).toMatch(/decode\/decode-0 may not speak for worker "decode-7"/);
    // nor list the registry (addresses) as an engine
    expect(await codeOf(clientAs(WorkerRegistry, reg, "decode").listWorkers({}))).toBe("PermissionDenied");
    expect(snapshot()).toEqual(before);
  });

  test("push needs a prefill identity", async () => {
    const before = snapshot();
    const pool = new KvPool(D().pool.shape, 32);
    const tokens = fakePrompt(12, 7, 256);
    const pre = fakePrefill(pool, tokens)!;
    for (const who of ["gateway", "decode", "admin"] as const) {
      const push = clientAs(KvTransfer, D().kvAddress, who).pushKv(
        (async function* () {
          for (const ch of buildChunks(
            pool,
            `evil-${who}`,
            pre.ids,
            pre.hashes,
            pre.hashes.map(() => false),
          ))
            yield ch;
        })(),
      );
      expect({ who, got: await codeOf(push) }).toEqual({ who, got: "PermissionDenied" });
    }
    expect(snapshot()).toEqual(before);
    // the data plane, with a client that would push anything: the server cuts a gateway certificate
    const asGateway = new DataPlaneClient({ tls: new TlsSource(pki.files("gateway")), timeoutMs: 3000 });
    const dp = await asGateway
      .push(
        await dpAddress(),
        buildChunks(
          pool,
          "evil-dp",
          pre.ids,
          pre.hashes,
          pre.hashes.map(() => false),
        ),
      )
      .catch((e: Error) => e);
    expect(dp).toBeInstanceOf(Error);
    expect((dp as Error).message).toMatch(/handshake|closed/);
    await asGateway.close?.();
    expect(snapshot()).toEqual(before);
    // a prefill certificate pushes (over gRPC and over the data plane), and the handle is then released
    for (const dataPlane of [false, undefined] as const) {
      const t = new RoutingTransport({ tls: new TlsSource(pki.files("prefill")), ...(dataPlane === false ? { dataPlane } : {}) });
      const mine = fakePrefill(pool, tokens)!;
      const stats = await transfer(t, D().kvAddress, pool, `ok-${dataPlane}`, mine.ids, mine.hashes);
      expect(stats.blocksSent + stats.blocksDeduped).toBe(mine.ids.length);
      expect(D().receiver!.pending()).toBe(1);
      await t.release!(D().kvAddress, `ok-${dataPlane}`);
      expect(D().receiver!.pending()).toBe(0);
      await t.close();
    }
  });

  test("drain and cancel need the gateway", async () => {
    const before = snapshot();
    for (const who of ["prefill", "decode", "both"] as const) {
      for (const n of [P(), D()]) {
        const ctl = clientAs(EngineControl, n.grpcAddress, who);
        expect(await codeOf(ctl.drain({ deadlineMs: 0n }))).toBe("PermissionDenied");
        expect(await codeOf(ctl.cancel({ requestId: "x" }))).toBe("PermissionDenied");
        expect(
          await codeOf(
            ctl.prefill(
              create(PrefillRequestSchema, { requestId: "r", prompt: "hi", decodeTarget: D().kvAddress, kvFormat: KV_FORMAT, sampling: { maxTokens: 1 } }),
            ),
          ),
        ).toBe("PermissionDenied");
        // Info is open to every member
        expect((await ctl.info({})).workerId).toBe(n.workerId);
      }
    }
    expect(snapshot()).toEqual(before);
    // the gateway and an admin certificate may
    expect((await clientAs(EngineControl, P().grpcAddress, "gateway").cancel({ requestId: "nothing-running" })).cancelled).toBe(false);
    expect((await clientAs(EngineControl, P().grpcAddress, "admin").cancel({ requestId: "nothing-running" })).cancelled).toBe(false);
  });

  test("prefill refuses a non decode target", async () => {
    let sawBytes = 0;
    // a plain HTTP server, as an SSRF target would be: it answers the ClientHello with a 400
    const sink: Server = createServer((s) =>
      s.on("data", (b) => {
        sawBytes += b.length;
        if (s.writable) s.end("HTTP/1.1 400 Bad Request\r\n\r\n");
      }),
    );
    await new Promise<void>((r) => sink.listen(0, "127.0.0.1", () => r()));
    const plainTarget = `127.0.0.1:${(sink.address() as { port: number }).port}`;
    const before = snapshot();
    const ctl = clientAs(EngineControl, P().grpcAddress, "gateway");
    const aim = async (decodeTarget: string) => {
      const e = await ctl
        .prefill(
          create(PrefillRequestSchema, {
            requestId: `ssrf-${decodeTarget}`,
            prompt: "a prompt long enough for two blocks",
            decodeTarget,
            kvFormat: KV_FORMAT,
            sampling: { maxTokens: 2 },
          }),
        )
        .catch((err: ConnectError) => err);
      expect(e).toBeInstanceOf(ConnectError);
      return (e as ConnectError).rawMessage;
    };
    // another engine's EngineControl port (a prefill certificate), the registry (the gateway's)
    expect(await aim(P().grpcAddress)).toMatch(/is prefill\/prefill-0, not one of decode, both/);
    expect(await aim(c.gateway.registryAddress)).toMatch(/is gateway\/gateway-0, not one of decode, both/);
    // a host that speaks no TLS at all: the handshake fails, no KV byte leaves P
    expect(await aim(plainTarget)).toMatch(/kv transfer to .* failed/);
    expect(snapshot()).toEqual(before);
    sink.close();
    // only a TLS ClientHello ever reached the plain host, never a KV payload
    expect(sawBytes).toBeLessThan(2048);
  });

  test("a gateway binds handles only to a replica id its certificate speaks for", async () => {
    const before = snapshot();
    const ctl = clientAs(EngineControl, P().grpcAddress, "gateway");
    const ask = (gatewayId: string) =>
      ctl.prefill(
        create(PrefillRequestSchema, {
          requestId: `owner-${gatewayId}`,
          prompt: "a prompt long enough for two blocks",
          decodeTarget: D().kvAddress,
          kvFormat: KV_FORMAT,
          sampling: { maxTokens: 2 },
          gatewayId,
        }),
      );
    // gateway-0's certificate cannot have another replica's handles freed early.
    expect(await codeOf(ask("gateway-1.0badf00d"))).toBe("PermissionDenied");
    expect(snapshot()).toEqual(before);
    // Its own id, with this incarnation's suffix, is taken; the handle is then its to release.
    const h = await ask("gateway-0.0badf00d");
    expect(D().receiver!.pending()).toBe(1);
    expect(await clientAs(KvTransfer, D().kvAddress, "gateway").release({ handleId: h.handleId })).toMatchObject({ released: true });
    expect(snapshot()).toEqual(before);
  });
});
