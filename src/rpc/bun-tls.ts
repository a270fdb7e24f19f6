import { peerIdentity, type PeerCertSource, type PeerRole } from "./peer-identity.ts";
import { refusal } from "./peer-policy.ts";
import { serverRefusal } from "./tls-client.ts";
import { bunClientTlsOptions, type TlsSource } from "./tls-config.ts";

/**
 * mTLS for Bun.listen / Bun.connect (the binary data plane). Two Bun (1.4) traits shape
 * it: a listener's handshake callback reports success even when the client's chain
 * failed verification (only `socket.authorized` is trustworthy), and Bun.connect
 * resolves before the handshake, drops what is written before it, and never calls
 * checkServerIdentity.
 */

/** Bun.listen's `tls`: a cluster certificate is required of every client. */
export function bunServerTls(tls: TlsSource) {
  const m = tls.current;
  return { cert: m.cert, key: m.key, ca: m.ca, requestCert: true, rejectUnauthorized: true };
}

/** Null when the server side of a finished handshake may serve `method` to its peer; else why not. */
export function admitBunPeer(socket: PeerCertSource, method: string): string | null {
  const why = refusal(method, peerIdentity(socket));
  return why === null ? null : why.message;
}

export interface BunDial {
  tls: ReturnType<typeof bunClientTlsOptions>;
  /** Call from the socket's handshake callback. */
  onHandshake(socket: PeerCertSource, ok: boolean, err: Error | null): void;
  /** Resolves once the server proved an expected identity; rejects with the reason otherwise. */
  verified: Promise<void>;
}

/** Options and the handshake check for one Bun.connect to `target`, whose certificate must name one of `expect`. */
export function bunDial(source: TlsSource, target: string, expect: readonly PeerRole[]): BunDial {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const verified = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  verified.catch(() => {});
  return {
    tls: bunClientTlsOptions(source.current),
    verified,
    onHandshake(socket, ok, err) {
      if (!ok || socket.authorized !== true) return reject(new Error(`TLS handshake with ${target} failed: ${err?.message ?? "certificate not verified"}`));
      const why = serverRefusal(target, peerIdentity(socket), expect);
      if (why !== null) reject(new Error(why));
      else resolve();
    },
  };
}
