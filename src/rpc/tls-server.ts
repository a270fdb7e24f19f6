import { ConnectError } from "@connectrpc/connect";
import * as http2 from "node:http2";
import type { PeerCheck } from "./peer-gate.ts";
import { peerIdentity, type PeerCertSource } from "./peer-identity.ts";
import { refusal } from "./peer-policy.ts";
import { Code } from "./status.ts";
import { serverTlsOptions, type TlsSource } from "./tls-config.ts";

// A client that connects and never finishes its handshake holds a socket: not for long.
const HANDSHAKE_TIMEOUT_MS = 10_000;

/**
 * An HTTP/2 server that requires a certificate of the cluster CA from every client and
 * takes rotated certificate files for new connections (setSecureContext).
 */
export function secureHttp2Server(
  tls: TlsSource,
  settings: http2.Settings,
  onRequest: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
): { server: http2.Http2SecureServer; stopFollowing: () => void } {
  const server = http2.createSecureServer({ settings, ...serverTlsOptions(tls.current), allowHTTP1: false, handshakeTimeout: HANDSHAKE_TIMEOUT_MS }, onRequest);
  const stopFollowing = tls.onChange((m) => server.setSecureContext(serverTlsOptions(m)));
  return { server, stopFollowing };
}

/**
 * The method table (peer-policy.ts) as a PeerCheck: the caller's certificate must name a
 * role the method is open to. Heartbeat's worker id is inside the body, so its handler
 * checks that half itself (the caller is in its context values).
 */
const rolePeerCheck: PeerCheck = (call) => {
  const peer = peerIdentity(call.tls as PeerCertSource | undefined);
  const method = call.method.split("?")[0]!.replace(/^\//, "");
  const why = refusal(method, peer);
  if (why !== null) throw new ConnectError(why.message, why.unauthenticated ? Code.Unauthenticated : Code.PermissionDenied);
};

/** On an mTLS server the role check runs first, then the server's own check (if any). */
export function withRoleCheck(tls: TlsSource | null, own: PeerCheck | undefined): PeerCheck | undefined {
  if (tls === null) return own;
  if (own === undefined) return rolePeerCheck;
  return (call) => {
    rolePeerCheck(call);
    own(call);
  };
}
