import "reflect-metadata";
import * as x509 from "@peculiar/x509";
import { chmodSync, mkdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PEER_ROLES, spiffeId, type PeerRole } from "../rpc/peer-identity.ts";
import { CLUSTER_TLS_NAME } from "../rpc/tls-config.ts";
import { ConfigError } from "./options.ts";
import { quote } from "../codec/index.ts";

x509.cryptoProvider.set(crypto);

const EC = { name: "ECDSA", namedCurve: "P-256" } as const;
const SIGN = { name: "ECDSA", hash: "SHA-256" } as const;
const DAY_MS = 24 * 3600 * 1000;

/** One process's identity: PEM certificate (leaf) and PKCS#8 key. */
export interface IssuedCert {
  role: PeerRole;
  workerId: string;
  certPem: string;
  keyPem: string;
}

export interface ClusterCerts {
  caPem: string;
  /** Kept so more certificates can be issued later in the same run (tests); never written by `certs`. */
  caKey: CryptoKey;
  caCert: x509.X509Certificate;
  issued: IssuedCert[];
}

export interface MintOptions {
  /** Extra DNS names every leaf carries besides localhost (e.g. Service names). */
  dnsNames?: readonly string[];
  /** Extra IP addresses besides 127.0.0.1 and ::1. */
  ipAddresses?: readonly string[];
  validDays?: number;
  /** CA subject, so two clusters' CAs are told apart in errors. */
  caName?: string;
}

/** A fresh cluster CA (ECDSA P-256, self-signed, pathLen 0). */
export async function mintCa(opts: MintOptions = {}): Promise<ClusterCerts> {
  const keys = await crypto.subtle.generateKey(EC, true, ["sign", "verify"]);
  const now = Date.now();
  const caCert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomSerial(),
    name: `CN=${opts.caName ?? "tl-engine cluster CA"}`,
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + (opts.validDays ?? 365) * DAY_MS),
    signingAlgorithm: SIGN,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { caPem: caCert.toString("pem"), caKey: keys.privateKey, caCert, issued: [] };
}

/**
 * Issues one leaf under `ca`: URI SAN spiffe://tl-engine/<role>/<workerId> plus the
 * cluster-wide TLS name and the loopback names, usable as both TLS server and client (every process is both).
 */
export async function issueCert(ca: ClusterCerts, role: PeerRole, workerId: string, opts: MintOptions = {}): Promise<IssuedCert> {
  const keys = await crypto.subtle.generateKey(EC, true, ["sign", "verify"]);
  const now = Date.now();
  const names: x509.JsonGeneralName[] = [
    { type: "url", value: spiffeId(role, workerId) },
    ...["localhost", CLUSTER_TLS_NAME, ...(opts.dnsNames ?? [])].map((value) => ({ type: "dns" as const, value })),
    ...["127.0.0.1", "::1", ...(opts.ipAddresses ?? [])].map((value) => ({ type: "ip" as const, value })),
  ];
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: randomSerial(),
    subject: `CN=${role}/${workerId || "*"}`,
    issuer: ca.caCert.subject,
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + (opts.validDays ?? 365) * DAY_MS),
    signingAlgorithm: SIGN,
    publicKey: keys.publicKey,
    signingKey: ca.caKey,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      new x509.SubjectAlternativeNameExtension(names),
      await x509.AuthorityKeyIdentifierExtension.create(ca.caCert),
    ],
  });
  const pkcs8 = await crypto.subtle.exportKey("pkcs8", keys.privateKey);
  const issued = { role, workerId, certPem: cert.toString("pem"), keyPem: x509.PemConverter.encode(pkcs8, "PRIVATE KEY") };
  ca.issued.push(issued);
  return issued;
}

/** How many processes of each role; the worker ids are `<role>-<i>` (gateway-0, prefill-1, ...). */
export type MintCounts = Partial<Record<PeerRole, number>>;

export async function mintCluster(counts: MintCounts, opts: MintOptions & { perRole?: boolean } = {}): Promise<ClusterCerts> {
  const ca = await mintCa(opts);
  for (const role of PEER_ROLES) {
    const n = counts[role] ?? 0;
    // Role-level: one certificate a Deployment's pods share, speaking for any worker id <role>-...
    if (opts.perRole) {
      if (n > 0) await issueCert(ca, role, "", opts);
      continue;
    }
    for (let i = 0; i < n; i++) await issueCert(ca, role, `${role}-${i}`, opts);
  }
  return ca;
}

/** The file names one issued cert is written under in a `certs` directory (`<role>.crt` for a role-level one). */
export function certFiles(dir: string, c: { workerId: string; role?: PeerRole }): { cert: string; key: string } {
  const name = c.workerId || c.role || "";
  return { cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) };
}

/** Writes ca.crt and <worker_id>.crt/.key into `dir` (created 0700); every file 0600. The CA key is never written. */
export function writeCerts(dir: string, set: ClusterCerts): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const put = (path: string, text: string) => {
    writeFileSync(path, text, { mode: 0o600 });
    chmodSync(path, 0o600);
  };
  put(join(dir, "ca.crt"), set.caPem);
  for (const c of set.issued) {
    const f = certFiles(dir, c);
    put(f.cert, c.certPem);
    put(f.key, c.keyPem);
  }
}

function randomSerial(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[0]! &= 0x7f; // positive INTEGER
  return Buffer.from(b).toString("hex");
}

const COUNT_FLAGS = ["gateway", "prefill", "decode", "both", "admin"] as const;

/**
 * `engine certs --out DIR [--gateway N] [--prefill N] [--decode N] [--both N] [--admin N]
 * [--dns NAME,...] [--ip ADDR,...] [--days D] [--per-role]`: a CA and one certificate per
 * process (or, with --per-role, one per role for a Deployment's pods to share).
 */
export async function runCerts(rest: Map<string, string>): Promise<string> {
  const out = rest.get("out");
  if (!out) throw new ConfigError("certs: --out DIR is required");
  const num = (k: string, d: number, max: number) => {
    const v = rest.get(k);
    if (v === undefined) return d;
    if (!/^\d+$/.test(v) || Number(v) > max) throw new ConfigError(`--${k}: want 0..${max}, got ${quote(v)}`);
    return Number(v);
  };
  for (const k of rest.keys()) {
    if (!["out", "dns", "ip", "days", "per-role", ...COUNT_FLAGS].includes(k)) throw new ConfigError(`certs: unknown option --${k}`);
  }
  const counts: MintCounts = {
    gateway: num("gateway", 1, 64),
    prefill: num("prefill", 1, 1024),
    decode: num("decode", 2, 1024),
    both: num("both", 0, 1024),
    admin: num("admin", 1, 64),
  };
  const list = (k: string) =>
    (rest.get(k) ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter((s) => s !== "");
  const opts = { dnsNames: list("dns"), ipAddresses: list("ip"), validDays: num("days", 365, 3650) || 365, perRole: rest.get("per-role") === "true" };
  if (existsNonEmpty(out, "ca.crt")) throw new ConfigError(`certs: ${out} already holds ca.crt; refusing to overwrite a CA`);
  const set = await mintCluster(counts, opts);
  writeCerts(out, set);
  return `wrote ${set.issued.length} certificates and ca.crt to ${out} (${set.issued.map((c) => c.workerId || `${c.role} (any ${c.role}-* worker)`).join(", ")})`;
}

function existsNonEmpty(dir: string, name: string): boolean {
  try {
    return statSync(join(dir, name)).size > 0;
  } catch {
    return false;
  }
}
