import { createContextKey, createContextValues, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import type { TLSSocket } from "node:tls";
import { peerIdentity, type PeerCertSource, type PeerIdentity } from "./peer-identity.ts";

/** Who is calling which method: what a peer check decides on. */
export interface PeerCall {
  /** "/package.Service/Method" */
  readonly method: string;
  /** the caller's address as the socket sees it */
  readonly remoteAddress: string;
  /** the TLS socket of the call when the server speaks TLS (its peer certificate names the caller); undefined in cleartext */
  readonly tls: TLSSocket | undefined;
}

/**
 * Decides, before any handler sees a call, whether this
 * caller may make it: throws a ConnectError (PERMISSION_DENIED, UNAUTHENTICATED) to
 * refuse, answered as a trailers-only gRPC status. The one place a peer-role layer
 * (mTLS identities against each method's allowed roles) plugs into every server.
 */
export type PeerCheck = (call: PeerCall) => void;

/**
 * The caller as a handler sees it: `undefined` on a plaintext server (loopback tests and
 * benchmarks, or an explicit --insecure), else the verified identity of its certificate.
 */
export type Caller = PeerIdentity | undefined;
export const callerKey = createContextKey<Caller>(undefined, { description: "tl-engine mTLS peer" });

/** The Connect context values for one request: the peer its TLS socket proved. */
export function callerValues(mtls: boolean) {
  return (req: { socket: unknown }): ContextValues => {
    const values = createContextValues();
    if (mtls) values.set(callerKey, peerIdentity(req.socket as PeerCertSource) ?? undefined);
    return values;
  };
}

export function callerOf(ctx: HandlerContext): Caller {
  // A hand-built context (unit tests calling a handler directly) may carry no values.
  return ctx.values?.get(callerKey);
}
