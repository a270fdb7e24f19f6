import { frontDoor, type FrontDoorOptions } from "./front-door.ts";

export interface HttpServer {
  readonly address: string;
  readonly port: number;
  stop(): Promise<void>;
}

export interface ServeHttpOptions extends FrontDoorOptions {
  host?: string;
  port?: number;
}

/**
 * Bun.serve on host:port (port 0 picks one), with an idle timeout long enough for slow
 * streams; every request passes the front door (API key, body bound) before `handler`.
 */
export function serveHttp(handler: (req: Request) => Promise<Response> | Response, opts: ServeHttpOptions): HttpServer {
  const host = opts.host ?? "127.0.0.1";
  const max = opts.maxRequestBytes;
  const server = Bun.serve({
    hostname: host,
    port: opts.port ?? 0,
    idleTimeout: 255,
    // Bun's own cut-off (a bare 413) stays far above the front door's, which judges every
    // body by its Content-Length or its count before reading on, and names the bound.
    maxRequestBodySize: Math.max(128 * 1024 * 1024, max * 2),
    fetch: frontDoor(handler, opts),
  });
  const port = server.port!;
  return {
    address: `${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    stop: async () => {
      await server.stop(true);
    },
  };
}
