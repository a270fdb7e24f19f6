import * as http2 from "node:http2";
import { type ConnectRouter, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { callerValues, type PeerCheck } from "./peer-gate.ts";
import type { TlsSource } from "./tls-config.ts";
import { secureHttp2Server, withRoleCheck } from "./tls-server.ts";
import { Code } from "./status.ts";

// Bounded: what a client may send before the handler reads it is buffered here. (The
// connection's own window stays at its default: raising it with setLocalWindowSize made
// Bun's server stop granting window mid-stream.)
const STREAM_WINDOW_BYTES = 4 * 1024 * 1024;
const MAX_FRAME_BYTES = 2 ** 24 - 1;

export interface GrpcServerOptions {
  /** Interface to bind; 127.0.0.1 unless told otherwise (tests and single-host clusters). */
  host?: string;
  /** 0 (the default) lets the OS pick; read the chosen one back from `port`. */
  port?: number;
  /** Largest single message accepted or sent, in bytes; Connect's default (~4 GiB) otherwise. */
  maxMessageBytes?: number;
  /** Runs for every call before its handler; see PeerCheck. */
  peerCheck?: PeerCheck;
  /**
   * Mutual TLS with this cluster set: a client needs a certificate of the cluster CA to
   * get past the handshake, each call is checked against the method table by the role
   * its certificate names (before `peerCheck`), and handlers find the caller under
   * `callerKey`. Cleartext h2c when absent.
   */
  tls?: TlsSource | null;
  /** Most concurrent connections (HTTP/2 sessions); more are closed at once. Default 1024. */
  maxSessions?: number;
}

export interface GrpcServer {
  /**
   * "host:port" (the form WorkerStatus and PrefillRequest carry) built from the
   * bind host; a server bound to 0.0.0.0 or :: must advertise a reachable name itself.
   */
  readonly address: string;
  readonly host: string;
  readonly port: number;
  /**
   * Stops accepting, resets every in-flight stream (handlers see ctx.signal
   * abort), destroys every session, and resolves once the listener is closed;
   * it does not wait for pooled client connections. Idempotent.
   */
  close(): Promise<void>;
}

/**
 * Serves Connect routes over HTTP/2, the transport gRPC clients (Connect's
 * createGrpcTransport, grpc-js, grpc-go, grpcurl) speak: mutual TLS with `tls`,
 * cleartext h2c without.
 * The Connect and gRPC-web protocols are answered on the same port as well.
 *
 * Client streams: under Bun (and Node) a client that aborts mid-stream can end
 * the handler's request iterable as if the stream had finished cleanly, with
 * ctx.signal not aborted. A handler must check completeness itself (KvChunk
 * counts against `total`) rather than trust the end of iteration.
 */
// Long by design: the server, its session and stream tracking and its close() share
// the sets close() empties; apart, close() could miss a stream opened in between.
export async function serveGrpc(routes: (router: ConnectRouter) => void, opts: GrpcServerOptions = {}): Promise<GrpcServer> {
  const host = opts.host ?? "127.0.0.1";
  const tls = opts.tls ?? null;
  const maxSessions = opts.maxSessions ?? 1024;
  const handler = connectNodeAdapter({
    routes,
    contextValues: callerValues(tls !== null),
    ...(opts.maxMessageBytes !== undefined ? { readMaxBytes: opts.maxMessageBytes, writeMaxBytes: opts.maxMessageBytes } : {}),
  });
  // Large windows and frames for what clients send: with the protocol's 64 KiB
  // defaults a client stream of KV blocks stalls on a WINDOW_UPDATE every 64 KiB.
  const peerCheck = withRoleCheck(tls, opts.peerCheck);
  const onRequest =
    peerCheck === undefined
      ? handler
      : (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void (admit(peerCheck, req, res) && handler(req, res));
  const settings = { initialWindowSize: STREAM_WINDOW_BYTES, maxFrameSize: MAX_FRAME_BYTES };
  const { server, stopFollowing } =
    tls === null ? { server: http2.createServer({ settings }, onRequest), stopFollowing: () => {} } : secureHttp2Server(tls, settings, onRequest);
  // server.close() alone waits for clients to hang up, which a pooled client
  // connection never does; track sessions so close() can end them.
  const sessions = new Set<http2.ServerHttp2Session>();
  const streams = new Set<http2.Http2Stream>();
  server.on("stream", (stream) => {
    streams.add(stream);
    stream.once("close", () => streams.delete(stream));
  });
  server.on("session", (session) => {
    // One bound on connections per port: a flood of idle ones is refused, not kept.
    if (sessions.size >= maxSessions) {
      session.destroy();
      return;
    }
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
    // An aborted client surfaces as a session error; it concerns that session only.
    session.on("error", () => {});
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error) => reject(err);
    server.once("error", onError);
    server.listen(opts.port ?? 0, host, () => {
      server.off("error", onError);
      resolve();
    });
  });
  const bound = server.address();
  if (bound === null || typeof bound === "string") {
    throw new Error(`grpc server bound to an unexpected address: ${String(bound)}`);
  }
  const port = bound.port;

  let closing: Promise<void> | undefined;
  return {
    address: `${formatHost(host)}:${port}`,
    host,
    port,
    close() {
      stopFollowing();
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        // An explicit reset, not just the session teardown, so that clients whose
        // request side is still open see CANCEL rather than a bare close.
        for (const stream of streams) stream.close(http2.constants.NGHTTP2_CANCEL);
        streams.clear();
        for (const session of sessions) session.destroy();
        sessions.clear();
      });
      return closing;
    },
  };
}

/** Runs the peer check; a refusal is answered here and the call goes no further. */
function admit(check: PeerCheck, req: http2.Http2ServerRequest, res: http2.Http2ServerResponse): boolean {
  const socket = req.socket as import("node:net").Socket & { encrypted?: boolean };
  try {
    check({ method: req.url, remoteAddress: socket.remoteAddress ?? "", tls: socket.encrypted ? (socket as import("node:tls").TLSSocket) : undefined });
    return true;
  } catch (e) {
    const err = ConnectError.from(e, Code.PermissionDenied);
    // Let the request body go: the call is over.
    req.resume();
    refuse(res, err);
    return false;
  }
}

/**
 * Answers a call refused before any handler with gRPC's Trailers-Only response: one
 * HEADERS frame carrying the status (grpc-message percent-encoded) that ends the stream.
 * (writeHead + end would send the headers, then end the stream apart and, the request
 * still open, reset it with NO_ERROR: grpc-js reads that as headers without a status and
 * reports INTERNAL "RST_STREAM code 0" instead of the code given here.)
 */
function refuse(res: http2.Http2ServerResponse, err: ConnectError): void {
  if (res.headersSent || res.destroyed) return;
  res.stream.respond(
    { ":status": 200, "content-type": "application/grpc", "grpc-status": String(err.code), "grpc-message": encodeURIComponent(err.rawMessage) },
    { endStream: true },
  );
}

// IPv6 literals need brackets in host:port form.
function formatHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}
