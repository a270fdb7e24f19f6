import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as http2 from "node:http2";
import { callerValues, refuseByRole } from "./peer-gate.ts";
import { serverTlsOptions, type TlsSource } from "./tls-config.ts";

type Intercept = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean;

export interface Http2ServeOptions {
  routes: (router: ConnectRouter) => void;
  settings: http2.Settings;
  maxMessageBytes?: number;
  /** Sees every (admitted) request first; one it answers itself (returns true) never reaches Connect. */
  intercept?: Intercept;
  /** mTLS with this cluster set, or cleartext h2c when null. */
  tls: TlsSource | null;
}

/**
 * The HTTP/2 server under every internal gRPC port. With `tls`, only a client holding a
 * certificate of the cluster CA gets past the handshake, the method table refuses a
 * wrong role before Connect or `intercept` reads the body, handlers find the caller
 * under `callerKey`, and rotated certificate files take effect for new connections.
 */
export function createRpcServer(opts: Http2ServeOptions): { server: http2.Http2Server | http2.Http2SecureServer; stopFollowing: () => void } {
  const mtls = opts.tls !== null;
  const handler = connectNodeAdapter({
    routes: opts.routes,
    contextValues: callerValues(mtls),
    ...(opts.maxMessageBytes !== undefined ? { readMaxBytes: opts.maxMessageBytes, writeMaxBytes: opts.maxMessageBytes } : {}),
  });
  const intercept = opts.intercept;
  const onRequest = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    if (mtls && refuseByRole(req, res)) return;
    if (intercept !== undefined && intercept(req, res)) return;
    void handler(req, res);
  };
  const base = { settings: opts.settings };
  if (opts.tls === null) return { server: http2.createServer(base, onRequest), stopFollowing: () => {} };
  const tls = opts.tls;
  const server = http2.createSecureServer({ ...base, ...serverTlsOptions(tls.current), allowHTTP1: false }, onRequest);
  const stopFollowing = tls.onChange((m) => server.setSecureContext(serverTlsOptions(m)));
  return { server, stopFollowing };
}
