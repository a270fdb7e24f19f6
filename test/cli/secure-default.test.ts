import { afterAll, expect, test } from "bun:test";
import { main } from "../../src/cli/main.ts";
import { isLoopback } from "../../src/cli/security.ts";
import { testPki } from "../support/certs.ts";
import { REPO, spawnProc, type Proc } from "./procs.ts";

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) p.proc.kill();
});

async function refused(args: string[]): Promise<string> {
  let err = "";
  const write = process.stderr.write.bind(process.stderr);
  process.stderr.write = ((s: string) => ((err += s), true)) as typeof process.stderr.write;
  try {
    expect(await main(args)).toBe(2);
  } finally {
    process.stderr.write = write;
  }
  return err;
}

const ports = ["--grpc-listen", "127.0.0.1:0", "--kv-listen", "127.0.0.1:0"];

test("plaintext beyond loopback needs insecure", async () => {
  expect(await refused(["--role", "decode", "--http-listen", "0.0.0.0:0", ...ports])).toMatch(
    /refusing to listen on 0\.0\.0\.0 without TLS: give tls_cert, tls_key and tls_ca/,
  );
  expect(await refused(["--role", "gateway", "--http-listen", "[::]:0", "--registry-listen", "127.0.0.1:0"])).toMatch(/refusing to listen on :: without TLS/);
  const pki = await testPki();
  const d = pki.files("decode");
  expect(await refused(["--role", "decode", "--tls-cert", d.cert, ...ports])).toMatch(/go together/);
  // a prefill certificate cannot run a decode engine, nor speak for another worker id
  const p = pki.files("prefill");
  expect(await refused(["--role", "decode", "--tls-cert", p.cert, "--tls-key", p.key, "--tls-ca", p.ca, ...ports])).toMatch(
    /names role prefill; this process runs as decode/,
  );
  expect(await refused(["--role", "decode", "--worker-id", "decode-9", "--tls-cert", d.cert, "--tls-key", d.key, "--tls-ca", d.ca, ...ports])).toMatch(
    /differs from the certificate's "decode-0"/,
  );
  expect(await refused(["--role", "decode", "--tls-cert", d.cert, "--tls-key", p.key, "--tls-ca", d.ca, ...ports])).toMatch(/does not belong/);
});

test("ready line says the mode", async () => {
  const pki = await testPki();
  const d = pki.files("both");
  const base = ["bun", "bin/engine.ts", "--role", "both", "--grpc-listen", "127.0.0.1:0", "--kv-listen", "127.0.0.1:0", "--num-blocks", "64"];
  const insecure = spawnProc([...base, "--http-listen", "0.0.0.0:0", "--insecure"], { cwd: REPO });
  const mtls = spawnProc(
    [...base, "--http-listen", "127.0.0.1:0", "--tls-cert", d.cert, "--tls-key", d.key, "--tls-ca", d.ca, "--api-key", "k1", "--api-key", "k2"],
    { cwd: REPO },
  );
  procs.push(insecure, mtls);
  expect(await insecure.ready()).toMatchObject({ tls: "plaintext", api_key: false });
  const ready = await mtls.ready();
  expect(ready).toMatchObject({ tls: "mtls", api_key: true, worker_id: "both-0" });
  // the engine's own HTTP port takes the key (either of them) too
  const models = (auth?: string) => fetch(`http://${ready.http}/v1/models`, { headers: auth ? { authorization: auth } : {} });
  expect((await models()).status).toBe(401);
  expect((await models("Bearer k2")).status).toBe(200);
  expect((await fetch(`http://${ready.http}/health`)).status).toBe(200);
  expect(insecure.stderr()).toContain("--insecure");
});

test("loopback hosts", () => {
  for (const h of ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]) expect(isLoopback(h)).toBe(true);
  for (const h of ["0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "localhost.evil", "::ffff:10.0.0.1"]) expect(isLoopback(h)).toBe(false);
});
