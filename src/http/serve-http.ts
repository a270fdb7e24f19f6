import { startConnGuard, upstreamSocketPath } from "./conn-guard.ts";
import { frontDoor, type FrontDoorOptions } from "./front-door.ts";

export interface HttpServer {
  readonly address: string;
  readonly port: number;
  /** Client connections open now. */
  readonly openConnections: number;
  stop(): Promise<void>;
}

export interface ServeHttpOptions extends FrontDoorOptions {
  host?: string;
  port?: number;
  /** A request's headers within this: the first one's 408 after it (the guard), a later one's connection cut (Bun.serve's idle timeout). */
  headersTimeoutS: number;
  /** Most client connections open at once (each holds two descriptors: the client's and the splice's). */
  maxConnections: number;
  /** Of maxConnections, how many only /health and /health/live may take. */
  healthReserve: number;
}

/** What a role's HTTP listener is given beside its address. */
export type HttpListenerOptions = Omit<ServeHttpOptions, "host" | "port">;

/** A response may go quiet this long (a stream waiting for its first token) before the connection is cut. */
const RESPONSE_IDLE_S = 255;

/**
 * Every HTTP listener: the connection guard (conn-guard.ts: a cap on connections with a reserve
 * for /health, the first headers' deadline) on host:port in front of Bun.serve on a private Unix
 * socket; every request passes the front door (API key, body bound and deadline) before `handler`.
 * Bun.serve's own idle timeout is the headers deadline of later requests on a connection; a
 * request's body gets the body deadline, its response RESPONSE_IDLE_S, and the guard closes a
 * connection quiet both ways that long (an idle keep-alive one among them).
 */
export async function serveHttp(handler: (req: Request) => Promise<Response> | Response, opts: ServeHttpOptions): Promise<HttpServer> {
  const host = opts.host ?? "127.0.0.1";
  const max = opts.maxRequestBytes;
  const headersS = opts.headersTimeoutS;
  const bodyS = opts.bodyTimeoutS;
  const socket = upstreamSocketPath();
  let server: ReturnType<typeof Bun.serve> | null = null;
  // Bun.serve cuts a connection at its timeout whatever is under way: a second past the
  // front door's own deadline, so the 408 goes out first.
  const door = frontDoor(handler, {
    ...opts,
    bodyTimeoutS: bodyS,
    phase: (req, phase) => server?.timeout(req, phase === "body" ? bodyS + 1 : RESPONSE_IDLE_S),
  });
  // Bun's own cut-off (a bare 413) stays far above the front door's, which judges every
  // body by its Content-Length or its count before reading on, and names the bound.
  const maxRequestBodySize = Math.max(128 * 1024 * 1024, max * 2);
  // Bun's types leave idleTimeout out of a Unix socket's options; Bun 1.4 applies it there too
  // (to a later request's headers: test/http/slow-clients.test.ts).
  server = Bun.serve({ unix: socket.path, idleTimeout: Math.min(255, headersS), maxRequestBodySize, fetch: door } as unknown as Parameters<
    typeof Bun.serve
  >[0]);
  let guard;
  try {
    guard = await startConnGuard(socket.path, {
      host,
      port: opts.port ?? 0,
      maxConnections: opts.maxConnections,
      healthReserve: opts.healthReserve,
      headersTimeoutMs: headersS * 1000,
      idleTimeoutMs: RESPONSE_IDLE_S * 1000,
    });
  } catch (e) {
    await server.stop(true);
    socket.remove();
    throw e;
  }
  const g = guard;
  return {
    address: `${host.includes(":") ? `[${host}]` : host}:${g.port}`,
    port: g.port,
    get openConnections() {
      return g.open;
    },
    stop: async () => {
      await g.close();
      await server!.stop(true);
      socket.remove();
    },
  };
}
