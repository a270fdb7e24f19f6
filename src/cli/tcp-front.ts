import { connect, createServer, type Server, type Socket } from "node:net";

/** Most client connections the front holds at once; beyond, new ones are closed at once. */
const MAX_CONNECTIONS = 1024;
/** A backend that does not accept the connection within this is skipped for the next one. */
const CONNECT_TIMEOUT_MS = 2000;
/** A connection that carries no byte either way for this long is closed (the gateway's own deadlines are shorter). */
const IDLE_TIMEOUT_MS = 120_000;

export interface TcpFront {
  readonly address: string;
  /** Connections handed to each backend so far, by address. */
  readonly served: ReadonlyMap<string, number>;
  close(): Promise<void>;
}

/**
 * A small round-robin TCP proxy: what a Kubernetes Service is to several gateway replicas,
 * for `engine cluster --gateways N` on a laptop. Each client connection goes to the next
 * backend in turn, bytes copied both ways with backpressure (pipe); a backend that refuses
 * or does not answer within CONNECT_TIMEOUT_MS is skipped for the next one, so a replica
 * that died costs no new connection. It never reads what it carries.
 */
export async function startTcpFront(host: string, port: number, backends: readonly string[]): Promise<TcpFront> {
  if (backends.length === 0) throw new Error("tcp front: no backend");
  const served = new Map<string, number>(backends.map((b) => [b, 0]));
  const open = new Set<Socket>();
  let next = 0;
  const dial = (client: Socket, tries: number): void => {
    const target = backends[next++ % backends.length]!;
    const colon = target.lastIndexOf(":");
    const up = connect({ host: target.slice(0, colon).replace(/^\[(.*)\]$/, "$1"), port: Number(target.slice(colon + 1)) });
    open.add(up);
    const timer = setTimeout(() => up.destroy(new Error(`${target}: no connection within ${CONNECT_TIMEOUT_MS} ms`)), CONNECT_TIMEOUT_MS);
    let connected = false;
    up.once("connect", () => {
      connected = true;
      clearTimeout(timer);
      served.set(target, (served.get(target) ?? 0) + 1);
      client.pipe(up);
      up.pipe(client);
      client.resume();
    });
    up.on("error", () => {
      clearTimeout(timer);
      if (!connected && tries + 1 < backends.length && !client.destroyed) return dial(client, tries + 1);
      client.destroy();
    });
    up.on("close", () => {
      open.delete(up);
      if (connected) client.destroy();
    });
    client.on("close", () => up.destroy());
  };
  const server: Server = createServer({ pauseOnConnect: true }, (client) => {
    if (open.size >= 2 * MAX_CONNECTIONS) return void client.destroy();
    open.add(client);
    client.setTimeout(IDLE_TIMEOUT_MS, () => client.destroy());
    client.on("error", () => client.destroy());
    client.on("close", () => open.delete(client));
    dial(client, 0);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as { port: number }).port;
  return {
    address: `${host.includes(":") ? `[${host}]` : host}:${bound}`,
    served,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}
