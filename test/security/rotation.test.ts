// Certificates rotate without a restart: new connections to every internal port see the
// new certificate once its files change.
import { expect, test } from "bun:test";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { copyFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { KvPool } from "../../src/pool/index.ts";
import { CLUSTER_TLS_NAME, TlsSource } from "../../src/rpc/tls-config.ts";
import { KvReceiver, serveKv } from "../../src/transfer/index.ts";
import { extraLeaf, testPki } from "../support/certs.ts";
import { SHAPE } from "../transfer/harness.ts";

test("rotated certificates take effect without a restart", async () => {
  const pki = await testPki();
  const [a, b] = [await extraLeaf(pki, "decode", "rot-a"), await extraLeaf(pki, "decode", "rot-b")];
  const dir = mkdtempSync(join(tmpdir(), "tl-rot-"));
  const files = { cert: join(dir, "tls.crt"), key: join(dir, "tls.key"), ca: join(dir, "ca.crt") };
  const put = (f: typeof a) => {
    copyFileSync(f.cert, files.cert);
    copyFileSync(f.key, files.key);
    copyFileSync(f.ca, files.ca);
  };
  put(a);
  const tls = new TlsSource(files, { pollMs: 50 });
  const rx = new KvReceiver(new KvPool(SHAPE, 8), { ttlMs: 60_000, pushIdleTimeoutMs: 10_000 });
  const kv = await serveKv(rx, { tls });
  const me = pki.material("prefill");
  const grpcSees = async () => {
    let seen = "";
    const url = `https://${kv.address}`;
    const session = new Http2SessionManager(url, undefined, {
      ca: me.ca,
      cert: me.cert,
      key: me.key,
      servername: CLUSTER_TLS_NAME,
      checkServerIdentity: (_h: string, c: { subjectaltname?: string }) => void (seen = c.subjectaltname ?? ""),
    });
    const res = await createClient(KvTransfer, createGrpcTransport({ baseUrl: url, sessionManager: session })).hasBlocks({ hashes: [1n], kvFormat: 1 });
    session.abort();
    return { seen, dp: res.dataPlaneAddress };
  };
  const dpSees = (address: string) =>
    new Promise<string>((resolve) => {
      const i = address.lastIndexOf(":");
      void Bun.connect({
        hostname: address.slice(0, i),
        port: Number(address.slice(i + 1)),
        tls: { ca: me.ca, cert: me.cert, key: me.key, serverName: CLUSTER_TLS_NAME },
        socket: {
          handshake(s) {
            resolve(String((s.getPeerCertificate() as { subjectaltname?: string })?.subjectaltname));
            s.end();
          },
          data() {},
        },
      });
    });
  try {
    const before = await grpcSees();
    expect(before.seen).toContain("decode/rot-a");
    expect(await dpSees(before.dp)).toContain("decode/rot-a");
    put(b);
    await Bun.sleep(300);
    const after = await grpcSees();
    expect(after.seen).toContain("decode/rot-b");
    expect(after.dp).toBe(before.dp); // the same port
    expect(await dpSees(after.dp)).toContain("decode/rot-b");
  } finally {
    await kv.close();
    rx.close();
    tls.close();
  }
});
