// Strangers on the data plane cannot stop KV pushes: on an mTLS data plane, connections that
// never finish a handshake have a short deadline and a small budget of their own (the oldest cut
// for a newcomer), apart from the admitted peers' cap; and a push whose data plane is out of
// reach goes over gRPC before it fails.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import * as net from "node:net";
import { KvPool } from "../../src/pool/index.ts";
import { TlsSource } from "../../src/rpc/tls-config.ts";
import {
  buildChunks,
  DataPlaneClient,
  KvReceiver,
  RoutingTransport,
  serveDataPlane,
  serveKv,
  transfer,
  type DataPlaneServer,
} from "../../src/transfer/index.ts";
import { testPki, type TestPki } from "../support/certs.ts";
import { fakePrefill, fakePrompt, kvDigest, patternDigest } from "../support/fake-model.ts";
import { evictAll, prefillTransport, SHAPE, startDecode } from "./harness.ts";

let pki: TestPki;
beforeAll(async () => {
  pki = await testPki();
});

/** `n` plain TCP connections that send nothing (no TLS ClientHello): their count of closed ones. */
async function strangers(port: number, n: number): Promise<{ sockets: net.Socket[]; closed: () => number }> {
  let closed = 0;
  const sockets = await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<net.Socket>((resolve) => {
          const s = net.connect(port, "127.0.0.1", () => resolve(s));
          s.on("error", () => {});
          s.once("close", () => closed++);
        }),
    ),
  );
  return { sockets, closed: () => closed };
}

describe("an mTLS data plane under a flood of unauthenticated sockets", () => {
  let rx: KvReceiver;
  let dp: DataPlaneServer;
  let client: DataPlaneClient;
  const P = new KvPool(SHAPE, 64);
  beforeAll(async () => {
    rx = new KvReceiver(new KvPool(SHAPE, 64), { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
    // The defaults but a short handshake deadline (Bun's socket timeouts have a one-second grain).
    dp = await serveDataPlane(rx, { tls: new TlsSource(pki.files("decode")), handshakeTimeoutMs: 1000 });
    client = new DataPlaneClient({ tls: new TlsSource(pki.files("prefill")), timeoutMs: 5000 });
  });
  afterAll(async () => {
    await client.close();
    await dp.close();
    rx.close();
  });

  async function push(handle: string, seed: number): Promise<void> {
    const tokens = fakePrompt(4 * 6 + 1, seed);
    const pre = fakePrefill(P, tokens)!;
    const ack = await client.push(dp.address, buildChunks(P, handle, pre.ids, pre.hashes, new Array(pre.hashes.length).fill(false)));
    P.releaseAll(pre.ids);
    evictAll(P);
    expect(ack.nTokens).toBe(tokens.length);
    const h = rx.claim(handle)!;
    expect(kvDigest(rx.pool, h.blockIds, h.nTokens)).toBe(patternDigest(SHAPE, tokens));
    rx.pool.releaseAll(h.blockIds);
  }

  test("300 idle sockets (more than the 256 admitted peers may hold): a prefill engine's new connection still pushes", async () => {
    const flood = await strangers(dp.port, 300);
    await Bun.sleep(100);
    // New connections each push (the client keeps its connection: close it so the next dials afresh).
    for (let i = 0; i < 3; i++) {
      await push(`after-flood-${i}`, 10 + i);
      await client.close();
    }
    // The unauthenticated ones are gone within the handshake deadline, not the 30 s idle timeout.
    const end = Date.now() + 4000;
    while (flood.closed() < 300 && Date.now() < end) await Bun.sleep(50);
    expect(flood.closed()).toBe(300);
    for (const s of flood.sockets) s.destroy();
  });

  test("a flood arriving while a peer dials: the push gets through (on the data plane, or on gRPC when its handshake was cut)", async () => {
    const rxK = new KvReceiver(new KvPool(SHAPE, 64), { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
    const kv = await serveKv(rxK, { tls: new TlsSource(pki.files("decode")) });
    const t = new RoutingTransport({ tls: new TlsSource(pki.files("prefill")), timeoutMs: 5000 });
    try {
      const dpPort = Number(kv.dataPlaneAddress.slice(kv.dataPlaneAddress.lastIndexOf(":") + 1));
      const flood = strangers(dpPort, 500);
      const tokens = fakePrompt(4 * 6 + 1, 21);
      const pre = fakePrefill(P, tokens)!;
      const st = await transfer(t, kv.address, P, "during-flood", pre.ids, pre.hashes);
      evictAll(P);
      expect(st.nTokens).toBe(tokens.length);
      const h = rxK.claim("during-flood")!;
      expect(kvDigest(rxK.pool, h.blockIds, h.nTokens)).toBe(patternDigest(SHAPE, tokens));
      rxK.pool.releaseAll(h.blockIds);
      for (const s of (await flood).sockets) s.destroy();
    } finally {
      await t.close();
      await kv.close();
      rxK.close();
    }
  });
});

test("a data plane that cannot be reached: the push goes over gRPC and succeeds", async () => {
  // An address nothing listens on, advertised as the data plane.
  const dead = net.createServer();
  await new Promise<void>((r) => dead.listen(0, "127.0.0.1", r));
  const port = (dead.address() as net.AddressInfo).port;
  await new Promise<void>((r) => dead.close(() => r()));
  const d = await startDecode("data-plane", { advertiseDataPlane: `127.0.0.1:${port}` });
  const t = prefillTransport("data-plane");
  const P = new KvPool(SHAPE, 64);
  try {
    const tokens = fakePrompt(4 * 5 + 2, 33);
    const pre = fakePrefill(P, tokens)!;
    const st = await transfer(t, d.target, P, "fallback", pre.ids, pre.hashes);
    expect([st.nTokens, t.dataPlaneFallbacks, P.used]).toEqual([tokens.length, 1, 0]);
    const h = d.rx.claim("fallback")!;
    expect(kvDigest(d.pool, h.blockIds, h.nTokens)).toBe(patternDigest(SHAPE, tokens));
    d.pool.releaseAll(h.blockIds);
  } finally {
    await t.close();
    await d.close();
  }
});
