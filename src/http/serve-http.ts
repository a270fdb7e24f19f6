export interface HttpServer {
  readonly address: string;
  readonly port: number;
  stop(): Promise<void>;
}

/** Bun.serve on host:port (port 0 picks one), with an idle timeout long enough for slow streams. */
export function serveHttp(handler: (req: Request) => Promise<Response> | Response, opts: { host?: string; port?: number } = {}): HttpServer {
  const host = opts.host ?? "127.0.0.1";
  const server = Bun.serve({ hostname: host, port: opts.port ?? 0, idleTimeout: 255, fetch: handler });
  const port = server.port!;
  return {
    address: `${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    stop: async () => {
      await server.stop(true);
    },
  };
}
