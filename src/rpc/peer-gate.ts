import { Code, createContextKey, createContextValues, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import type * as http2 from "node:http2";
import { peerIdentity, type PeerCertSource, type PeerIdentity } from "./peer-identity.ts";
import { refusal } from "./peer-policy.ts";

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

/** "/tl.engine.v1.EngineControl/Drain?x" → "tl.engine.v1.EngineControl/Drain" */
export function methodOfPath(path: string | undefined): string {
  const p = (path ?? "").split("?")[0]!;
  return p.startsWith("/") ? p.slice(1) : p;
}

/**
 * Answers a request whose caller the method table refuses, before Connect (or the
 * direct PushKv handler) reads a byte of its body; returns true when it did. A gRPC
 * client gets a trailers-only response; a Connect-protocol client its JSON error.
 * Only on an mTLS server: a plaintext one has no identities to check.
 */
export function refuseByRole(req: http2.Http2ServerRequest, res: http2.Http2ServerResponse): boolean {
  const method = methodOfPath(req.url);
  const peer = peerIdentity(req.socket as unknown as PeerCertSource);
  // Heartbeat's worker id is inside the body: its handler checks that half (sameWorker).
  const why = refusal(method, peer, peer?.workerId);
  if (why === null) return false;
  writeRefusal(req, res, why.unauthenticated ? Code.Unauthenticated : Code.PermissionDenied, why.message);
  return true;
}

const HTTP_FOR: Partial<Record<Code, number>> = { [Code.Unauthenticated]: 401, [Code.PermissionDenied]: 403, [Code.ResourceExhausted]: 429 };
const CONNECT_NAME: Partial<Record<Code, string>> = {
  [Code.Unauthenticated]: "unauthenticated",
  [Code.PermissionDenied]: "permission_denied",
  [Code.ResourceExhausted]: "resource_exhausted",
};

/** A refusal in the caller's own protocol; the request body is never read. */
export function writeRefusal(req: http2.Http2ServerRequest, res: http2.Http2ServerResponse, code: Code, message: string): void {
  const type = String(req.headers["content-type"] ?? "");
  if (type.startsWith("application/grpc")) {
    res.writeHead(200, { "content-type": type.startsWith("application/grpc-web") ? type : "application/grpc", "grpc-status": String(code), "grpc-message": encodeURIComponent(message) });
    res.end();
  } else {
    res.writeHead(HTTP_FOR[code] ?? 400, { "content-type": "application/json" });
    res.end(JSON.stringify({ code: CONNECT_NAME[code] ?? "unknown", message }));
  }
  // The client may still be sending: reset our side so its body is not buffered.
  req.stream?.close?.();
}
