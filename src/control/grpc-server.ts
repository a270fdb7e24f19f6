import * as http2 from "node:http2";
import type { ConnectRouter } from "@connectrpc/connect";
import type { TlsSource } from "../rpc/tls-config.ts";
import { createRpcServer } from "../rpc/tls-server.ts";

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
  /** Sees every request first; one it answers itself (returns true) never reaches Connect. */
  intercept?: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean;
  /** Mutual TLS with the cluster set, callers checked by role (src/rpc); cleartext h2c when absent. */
  tls?: TlsSource | null;
  /** Most concurrent connections; default 1024. */
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
 * createGrpcTransport, grpc-js, grpc-go, grpcurl) speak: mutual TLS with `tls`
 * (every caller's role checked against src/rpc's method table), else cleartext h2c.
 * The Connect and gRPC-web protocols are answered on the same port as well.
 *
 * Client streams: under Bun (and Node) a client that aborts mid-stream can end
 * the handler's request iterable as if the stream had finished cleanly, with
 * ctx.signal not aborted. A handler must check completeness itself (KvChunk
 * counts against `total`) rather than trust the end of iteration.
 */
export async function serveGrpc(
  routes: (router: ConnectRouter) => void,
  opts: GrpcServerOptions = {},
): Promise<GrpcServer> {
  const host = opts.host ?? "127.0.0.1";
  const maxSessions = opts.maxSessions ?? 1024;
  // Large windows and frames for what clients send: with the protocol's 64 KiB
  // defaults a client stream of KV blocks stalls on a WINDOW_UPDATE every 64 KiB.
  const { server, stopFollowing } = createRpcServer({
    routes,
    settings: { initialWindowSize: STREAM_WINDOW_BYTES, maxFrameSize: MAX_FRAME_BYTES },
    maxMessageBytes: opts.maxMessageBytes,
    intercept: opts.intercept,
    tls: opts.tls ?? null,
  });
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

// IPv6 literals need brackets in host:port form.
function formatHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}
