import { quote } from "../codec/index.ts";
/**
 * Who is on the other end of a mutual-TLS connection: the SPIFFE-style URI SAN
 * `spiffe://tl-engine/<role>/<worker_id>` of the certificate the cluster CA issued it.
 * TLS itself has already proved the chain; this module only reads the name.
 */

export type PeerRole = "gateway" | "prefill" | "decode" | "both" | "admin";
export const PEER_ROLES: readonly PeerRole[] = ["gateway", "prefill", "decode", "both", "admin"];

const SPIFFE_TRUST_DOMAIN = "tl-engine";
const WORKER_ID = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * `workerId` "" is a role-level identity, `spiffe://tl-engine/<role>`: one certificate
 * shared by every pod of a Deployment, which may speak for any worker id `<role>-...`
 * (pod names). A per-process certificate binds exactly one worker id.
 */
export interface PeerIdentity {
  role: PeerRole;
  workerId: string;
}

export function spiffeId(role: PeerRole, workerId: string): string {
  if (workerId === "") return `spiffe://${SPIFFE_TRUST_DOMAIN}/${role}`;
  if (!WORKER_ID.test(workerId)) throw new Error(`worker id ${quote(workerId)}: want 1..128 of [A-Za-z0-9._-]`);
  return `spiffe://${SPIFFE_TRUST_DOMAIN}/${role}/${workerId}`;
}

/** The identity a `spiffe://tl-engine/<role>[/<id>]` URI names, or null for anything else. */
export function parseSpiffeId(uri: string): PeerIdentity | null {
  const m = /^spiffe:\/\/([^/]+)\/([a-z]+)(?:\/([^/]+))?$/.exec(uri);
  if (!m || m[1] !== SPIFFE_TRUST_DOMAIN) return null;
  const role = m[2] as PeerRole;
  const workerId = m[3] ?? "";
  if (!PEER_ROLES.includes(role) || (workerId !== "" && !WORKER_ID.test(workerId))) return null;
  return { role, workerId };
}

/** Whether `id` may speak for worker `workerId`: its own id, or for a role-level identity any `<role>-...`. */
export function speaksFor(id: PeerIdentity, workerId: string | undefined): boolean {
  if (workerId === undefined || workerId === "") return false;
  return id.workerId === "" ? workerId.startsWith(`${id.role}-`) && WORKER_ID.test(workerId) : id.workerId === workerId;
}

/** The key per-peer caps count under: the worker id, or `<role>/*` for a role-level identity. */
export function peerKey(id: PeerIdentity): string {
  return id.workerId === "" ? `${id.role}/*` : id.workerId;
}

/**
 * The identity in a peer certificate's subjectAltName as Node's TLS reports it
 * (`"DNS:localhost, URI:spiffe://tl-engine/decode/d-0, IP Address:127.0.0.1"`).
 * Exactly one tl-engine URI must be present: two would let a certificate claim two roles.
 */
export function identityFromSubjectAltName(san: string | undefined): PeerIdentity | null {
  if (!san) return null;
  const found: PeerIdentity[] = [];
  for (const part of splitSan(san)) {
    if (!part.startsWith("URI:")) continue;
    const id = parseSpiffeId(part.slice(4));
    if (id) found.push(id);
    else if (part.slice(4).startsWith(`spiffe://${SPIFFE_TRUST_DOMAIN}/`)) return null;
  }
  return found.length === 1 ? found[0]! : null;
}

// Node quotes entries holding a comma or quote (JSON string syntax); the URIs we issue never
// need it, so a quoted entry is read as its JSON string and an unparsable one dropped.
function splitSan(san: string): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < san.length) {
    while (san[i] === " " || san[i] === ",") i++;
    if (i >= san.length) break;
    const colon = san.indexOf(":", i);
    if (colon < 0) break;
    const kind = san.slice(i, colon + 1);
    if (san[colon + 1] === '"') {
      let j = colon + 2;
      while (j < san.length && san[j] !== '"') j += san[j] === "\\" ? 2 : 1;
      try {
        out.push(kind + (JSON.parse(san.slice(colon + 1, j + 1)) as string));
      } catch {}
      i = j + 1;
      continue;
    }
    const end = san.indexOf(", ", colon);
    out.push(san.slice(i, end < 0 ? san.length : end));
    i = end < 0 ? san.length : end + 2;
  }
  return out;
}

/** What a TLS socket exposes about its peer (node:tls TLSSocket and Bun's share it). */
export interface PeerCertSource {
  authorized?: boolean;
  getPeerCertificate(detailed?: boolean): { subjectaltname?: string } | null | object;
}

/** The verified identity of a TLS socket's peer, or null (no cert, unverified, or no tl-engine URI). */
export function peerIdentity(socket: PeerCertSource | null | undefined): PeerIdentity | null {
  if (socket?.authorized !== true) return null;
  const cert = socket.getPeerCertificate(false) as { subjectaltname?: string } | null;
  return identityFromSubjectAltName(cert?.subjectaltname);
}

export function formatIdentity(id: PeerIdentity | null): string {
  return id === null ? "an unidentified peer" : `${id.role}/${id.workerId === "" ? "*" : id.workerId}`;
}
