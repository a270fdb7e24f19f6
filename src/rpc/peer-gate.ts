import { createContextKey, createContextValues, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import { peerIdentity, type PeerCertSource, type PeerIdentity } from "./peer-identity.ts";

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
