import { expect, test } from "bun:test";
import { X509Certificate, createPrivateKey } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runCerts } from "../../src/cli/certs.ts";
import { ConfigError } from "../../src/cli/options.ts";
import { loadTlsMaterial } from "../../src/rpc/tls-config.ts";
import { main } from "../../src/cli/main.ts";

test("certs mints a cluster", async () => {
  const out = join(mkdtempSync(join(tmpdir(), "tl-certs-")), "pki");
  const msg = await runCerts(
    new Map([
      ["out", out],
      ["gateway", "1"],
      ["prefill", "2"],
      ["decode", "1"],
      ["dns", "gw.svc,d.svc"],
    ]),
  );
  expect(msg).toMatch(/wrote 5 certificates/);
  expect(statSync(out).mode & 0o777).toBe(0o700);
  const names = readdirSync(out).sort();
  expect(names).toEqual([
    "admin-0.crt",
    "admin-0.key",
    "ca.crt",
    "decode-0.crt",
    "decode-0.key",
    "gateway-0.crt",
    "gateway-0.key",
    "prefill-0.crt",
    "prefill-0.key",
    "prefill-1.crt",
    "prefill-1.key",
  ]);
  for (const n of names) expect(statSync(join(out, n)).mode & 0o777).toBe(0o600);

  const ca = new X509Certificate(readFileSync(join(out, "ca.crt")));
  expect(ca.ca).toBe(true);
  for (const id of ["gateway-0", "prefill-0", "prefill-1", "decode-0", "admin-0"]) {
    const leaf = new X509Certificate(readFileSync(join(out, `${id}.crt`)));
    expect(leaf.ca).toBe(false);
    expect(leaf.checkIssued(ca)).toBe(true);
    expect(leaf.verify(ca.publicKey)).toBe(true);
    expect(leaf.checkPrivateKey(createPrivateKey(readFileSync(join(out, `${id}.key`))))).toBe(true);
    const role = id.split("-")[0];
    expect(leaf.subjectAltName).toContain(`URI:spiffe://tl-engine/${role}/${id}`);
    expect(leaf.subjectAltName).toContain("DNS:localhost");
    expect(leaf.subjectAltName).toContain("DNS:gw.svc");
    expect(leaf.subjectAltName).toContain("IP Address:127.0.0.1");
    expect(loadTlsMaterial({ cert: join(out, `${id}.crt`), key: join(out, `${id}.key`), ca: join(out, "ca.crt") }).self).toEqual({
      role: role as never,
      workerId: id,
    });
  }
  // Minting again into the same dir would orphan every issued certificate: refused.
  await expect(runCerts(new Map([["out", out]]))).rejects.toThrow(/refusing to overwrite/);
});

test("certs refuses bad options", async () => {
  await expect(runCerts(new Map())).rejects.toThrow(ConfigError);
  await expect(
    runCerts(
      new Map([
        ["out", "/tmp/x"],
        ["decode", "-1"],
      ]),
    ),
  ).rejects.toThrow(/--decode: want 0..1024/);
  await expect(
    runCerts(
      new Map([
        ["out", "/tmp/x"],
        ["frobnicate", "1"],
      ]),
    ),
  ).rejects.toThrow(/unknown option --frobnicate/);
});

test("engine certs subcommand", async () => {
  const out = join(mkdtempSync(join(tmpdir(), "tl-certs-")), "pki");
  expect(await main(["certs", "--out", out, "--decode", "1", "--prefill", "1"])).toBe(0);
  expect(readdirSync(out)).toContain("decode-0.key");
  expect(await main(["certs"])).toBe(2);
});

test("certs per role for deployments", async () => {
  const out = join(mkdtempSync(join(tmpdir(), "tl-certs-")), "pki");
  expect(await main(["certs", "--out", out, "--per-role", "--dns", "gateway-registry"])).toBe(0);
  expect(readdirSync(out).sort()).toEqual([
    "admin.crt",
    "admin.key",
    "ca.crt",
    "decode.crt",
    "decode.key",
    "gateway.crt",
    "gateway.key",
    "prefill.crt",
    "prefill.key",
  ]);
  const leaf = new X509Certificate(readFileSync(join(out, "decode.crt")));
  expect(leaf.subjectAltName).toContain("URI:spiffe://tl-engine/decode,");
  expect(loadTlsMaterial({ cert: join(out, "decode.crt"), key: join(out, "decode.key"), ca: join(out, "ca.crt") }).self).toEqual({
    role: "decode",
    workerId: "",
  });
});
