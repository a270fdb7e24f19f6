import type * as http2 from "node:http2";
import { formatIdentity, type PeerIdentity, type PeerRole } from "./peer-identity.ts";
import { clientTlsOptions, type TlsSource } from "./tls-config.ts";

/** How a client dials a cluster peer over mTLS: its own set, and which roles the server must hold. */
export interface ClientTls {
  source: TlsSource;
  /** Roles the server's certificate must name; any cluster member when omitted. */
  expect?: readonly PeerRole[];
}

/** Why `peer`, dialled at `target`, is not a server this client should talk to (null: it is). */
export function serverRefusal(target: string, peer: PeerIdentity | null, expect: readonly PeerRole[] | undefined): string | null {
  if (peer === null) return `${target} presented no tl-engine cluster identity`;
  if (expect !== undefined && !expect.includes(peer.role)) return `${target} is ${formatIdentity(peer)}, not one of ${expect.join(", ")}`;
  return null;
}

/** Session options for connect-node's Http2SessionManager: fails the handshake on a wrong server. */
export function secureSessionOptions(t: ClientTls, target: string): http2.SecureClientSessionOptions {
  return clientTlsOptions(t.source.current, (peer) => serverRefusal(target, peer, t.expect));
}

/** Cache key of a client channel: one per target, TLS material and expected roles. */
export function channelKey(target: string, t: ClientTls | undefined): string {
  if (t === undefined) return `h2c:${target}`;
  const self = t.source.current.self;
  return `h2:${target}|${self.role}/${self.workerId}#${t.source.generation}|${(t.expect ?? []).join(",")}`;
}
