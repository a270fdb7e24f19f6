import { expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadTlsMaterial, TlsSource } from "../../src/rpc/tls-config.ts";
import { extraLeaf, testPki } from "../support/certs.ts";

test("tls material is checked at load", async () => {
  const pki = await testPki();
  expect(loadTlsMaterial(pki.files("decode")).self).toEqual({ role: "decode", workerId: "decode-0" });
  // a leaf from another CA than the one named
  expect(() => loadTlsMaterial({ ...pki.strangerFiles("decode"), ca: pki.files("decode").ca })).toThrow(/not issued by the CA/);
  expect(() => loadTlsMaterial({ ...pki.files("decode"), cert: "/nonexistent.crt" })).toThrow(/tls_cert \/nonexistent.crt/);
  const dir = mkdtempSync(join(tmpdir(), "tl-tls-"));
  writeFileSync(join(dir, "junk.crt"), "not pem");
  expect(() => loadTlsMaterial({ ...pki.files("decode"), cert: join(dir, "junk.crt") })).toThrow(/not a PEM certificate/);
  expect(() => loadTlsMaterial({ ...pki.files("decode"), key: pki.files("prefill").key })).toThrow(/does not belong to the certificate/);
  // the CA itself has no tl-engine identity
  expect(() => loadTlsMaterial({ ...pki.files("decode"), cert: pki.files("decode").ca })).toThrow(/not issued|no spiffe/);
});

test("tls source follows its files", async () => {
  const pki = await testPki();
  const d1 = await extraLeaf(pki, "decode", "rot-1");
  const d2 = await extraLeaf(pki, "decode", "rot-2");
  const dir = mkdtempSync(join(tmpdir(), "tl-tls-"));
  const files = { cert: join(dir, "tls.crt"), key: join(dir, "tls.key"), ca: join(dir, "ca.crt") };
  const put = (f: { cert: string; key: string; ca: string }) => {
    copyFileSync(f.cert, files.cert);
    copyFileSync(f.key, files.key);
    copyFileSync(f.ca, files.ca);
  };
  put(d1);
  const errors: Error[] = [];
  const src = new TlsSource(files, { pollMs: 60_000, onError: (e) => errors.push(e) });
  const seen: string[] = [];
  src.onChange((m) => seen.push(m.self.workerId));
  expect(src.current.self.workerId).toBe("rot-1");
  expect(src.check()).toBe(false);
  put(d2);
  expect(src.check()).toBe(true);
  expect(src.current.self.workerId).toBe("rot-2");
  // a half-written rotation (new cert, old key still pending) keeps the last good set
  copyFileSync(d1.cert, files.cert);
  expect(src.check()).toBe(false);
  writeFileSync(files.cert, "-----BEGIN CERTIFICATE-----\ntruncated");
  expect(src.check()).toBe(false);
  expect(src.current.self.workerId).toBe("rot-2");
  expect(errors.map((e) => e.message)).toEqual([expect.stringMatching(/does not belong/), expect.stringMatching(/not a PEM certificate/)]);
  expect(seen).toEqual(["rot-2"]);
  src.close();
});
