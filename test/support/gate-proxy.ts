// A TCP proxy whose forwarding a test steers: it can hold the client's bytes until
// opened (a slow link), and reset both sides when the decode side answers while a
// condition holds (an ack lost on the way back), the first `maxCuts` times.
import * as net from "node:net";
import { connectUpstream, resetBoth } from "./cutting-proxy.ts";

export interface GateProxy {
  /** host:port to dial instead of the target */
  readonly address: string;
  /** Resolves when the first client bytes arrive (a connection is in use). */
  readonly arrived: Promise<void>;
  /** Forwards what was held and everything after it. */
  open(): void;
  /** connections reset by `cutReplyWhen` */
  cuts(): number;
  close(): Promise<void>;
}

export async function startGateProxy(
  target: string | (() => string),
  opts: { held?: boolean; cutReplyWhen?: () => boolean; maxCuts?: number } = {},
): Promise<GateProxy> {
  let opened = !opts.held;
  const waiting: (() => void)[] = [];
  let cut = 0;
  let onArrive!: () => void;
  const arrived = new Promise<void>((r) => (onArrive = r));
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = connectUpstream(target);
    const kill = () => resetBoth(client, upstream);
    client.on("data", (buf: Buffer) => {
      onArrive();
      if (opened) upstream.write(buf);
      else waiting.push(() => upstream.write(buf));
    });
    upstream.on("data", (buf: Buffer) => {
      if (cut < (opts.maxCuts ?? Infinity) && opts.cutReplyWhen?.()) {
        cut++;
        kill();
        return;
      }
      client.write(buf);
    });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => {
        sockets.delete(s);
        kill();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    arrived,
    open() {
      opened = true;
      for (const w of waiting.splice(0)) w();
    },
    cuts: () => cut,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
