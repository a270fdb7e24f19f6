import { createPrivateKey, X509Certificate } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { identityFromSubjectAltName, type PeerIdentity } from "./peer-identity.ts";
import { quote } from "../codec/index.ts";

/**
 * The name every client puts in SNI and every leaf carries as a DNS SAN. Peers are
 * identified by their URI SAN, not by the host they were dialled at (pod IPs change);
 * Bun.connect offers no checkServerIdentity hook, so the host check is satisfied with
 * this one cluster-wide name and the URI SAN is checked after the handshake instead.
 */
export const CLUSTER_TLS_NAME = "tl-engine.cluster";

export interface TlsFiles {
  cert: string;
  key: string;
  ca: string;
}

/** One loaded set: PEM text plus the identity this process's own certificate names. */
export interface TlsMaterial {
  cert: string;
  key: string;
  ca: string;
  self: PeerIdentity;
  notAfter: Date;
}

export class TlsConfigError extends Error {}

/** Reads and checks a cert/key/CA triple: the leaf must chain to the CA and name a tl-engine identity. */
export function loadTlsMaterial(files: TlsFiles): TlsMaterial {
  const read = (what: string, path: string) => {
    try {
      return readFileSync(path, "utf8");
    } catch (e) {
      throw new TlsConfigError(`tls_${what} ${path}: ${e instanceof Error ? e.message : String(e)}`);
    }
  };
  const material = { cert: read("cert", files.cert), key: read("key", files.key), ca: read("ca", files.ca) };
  let leaf: X509Certificate;
  let ca: X509Certificate;
  try {
    leaf = new X509Certificate(material.cert);
  } catch (e) {
    throw new TlsConfigError(`tls_cert ${files.cert}: not a PEM certificate (${e instanceof Error ? e.message : String(e)})`);
  }
  try {
    ca = new X509Certificate(material.ca);
  } catch (e) {
    throw new TlsConfigError(`tls_ca ${files.ca}: not a PEM certificate (${e instanceof Error ? e.message : String(e)})`);
  }
  if (!leaf.checkIssued(ca) || !leaf.verify(ca.publicKey)) throw new TlsConfigError(`tls_cert ${files.cert}: not issued by the CA in ${files.ca}`);
  const self = identityFromSubjectAltName(leaf.subjectAltName);
  if (self === null)
    throw new TlsConfigError(`tls_cert ${files.cert}: no spiffe://tl-engine/<role>/<worker_id> URI SAN (got ${quote(leaf.subjectAltName ?? "")})`);
  let keyMatches = false;
  try {
    keyMatches = leaf.checkPrivateKey(createPrivateKey(material.key));
  } catch (e) {
    throw new TlsConfigError(`tls_key ${files.key}: not a PEM private key (${e instanceof Error ? e.message : String(e)})`);
  }
  if (!keyMatches) throw new TlsConfigError(`tls_key ${files.key}: does not belong to the certificate in ${files.cert}`);
  const notAfter = new Date(leaf.validTo);
  if (notAfter.getTime() < Date.now()) throw new TlsConfigError(`tls_cert ${files.cert}: expired at ${notAfter.toISOString()}`);
  return { ...material, self, notAfter };
}

/** Options for node:tls / node:http2 / Bun.listen servers: a cluster certificate is required of every client. */
export function serverTlsOptions(m: TlsMaterial) {
  return { cert: m.cert, key: m.key, ca: m.ca, requestCert: true, rejectUnauthorized: true, minVersion: "TLSv1.2" as const };
}

/**
 * Options for node:tls / node:http2 clients (connect-node's nodeOptions). The server's
 * chain is verified against the cluster CA; instead of the host name, its URI SAN must
 * name one of `expect` (any cluster member when omitted), so a prefill engine's push
 * fails during the handshake when its decode_target is not a decode engine.
 */
export function clientTlsOptions(m: TlsMaterial, expect?: (peer: PeerIdentity | null) => string | null) {
  return {
    cert: m.cert,
    key: m.key,
    ca: m.ca,
    servername: CLUSTER_TLS_NAME,
    rejectUnauthorized: true,
    minVersion: "TLSv1.2" as const,
    checkServerIdentity: (_host: string, cert: { subjectaltname?: string }) => {
      const peer = identityFromSubjectAltName(cert.subjectaltname);
      const why = expect ? expect(peer) : peer === null ? "the server presented no cluster identity" : null;
      return why === null ? undefined : new Error(why);
    },
  };
}

/** Options for Bun.connect; pair with `peerIdentity` (peer-identity.ts) in the handshake callback (Bun skips checkServerIdentity). */
export function bunClientTlsOptions(m: TlsMaterial) {
  return { cert: m.cert, key: m.key, ca: m.ca, serverName: CLUSTER_TLS_NAME, rejectUnauthorized: true };
}

/**
 * A cert/key/CA set that follows its files: `current` is re-read when any file's
 * mtime or size changes (checked at most every `pollMs`), so certificates rotate
 * without a restart. A half-written or mismatched set is ignored (the last good one
 * stays) and reported once through `onError`.
 */
export class TlsSource {
  private material: TlsMaterial;
  private stamp: string;
  private timer: ReturnType<typeof setInterval> | undefined;
  private readonly listeners = new Set<(m: TlsMaterial) => void>();
  /** Bumped on every reload: clients key their cached connections by it. */
  generation = 0;

  constructor(
    readonly files: TlsFiles,
    private readonly opts: { pollMs?: number; onError?: (e: Error) => void } = {},
  ) {
    this.material = loadTlsMaterial(files);
    this.stamp = this.stat();
  }

  get current(): TlsMaterial {
    return this.material;
  }

  /** Calls `fn` with each newly loaded set; the first call starts watching the files. */
  onChange(fn: (m: TlsMaterial) => void): () => void {
    this.listeners.add(fn);
    this.timer ??= setInterval(() => this.check(), this.opts.pollMs ?? 5000);
    this.timer.unref?.();
    return () => this.listeners.delete(fn);
  }

  /** Re-reads now if the files changed; true when a new set was loaded. */
  check(): boolean {
    const stamp = this.stat();
    if (stamp === this.stamp) return false;
    let next: TlsMaterial;
    try {
      next = loadTlsMaterial(this.files);
    } catch (e) {
      this.opts.onError?.(e instanceof Error ? e : new Error(String(e)));
      this.stamp = stamp;
      return false;
    }
    this.stamp = stamp;
    this.material = next;
    this.generation++;
    for (const fn of this.listeners) fn(next);
    return true;
  }

  close(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    this.listeners.clear();
  }

  private stat(): string {
    return [this.files.cert, this.files.key, this.files.ca]
      .map((p) => {
        try {
          const s = statSync(p);
          return `${s.mtimeMs}:${s.size}`;
        } catch {
          return "missing";
        }
      })
      .join("|");
  }
}
