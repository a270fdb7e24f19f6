import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * The TCP side of every HTTP listener, in front of Bun.serve (which reads a request's headers
 * before any code of ours sees it, and counts no connections): it owns the client connections,
 * so it can bound what Bun.serve cannot.
 *
 *  1. At most `maxConnections` open at once; a connection past that is closed unread.
 *  2. The first request's whole header block within `headersTimeoutMs`, else 408 and closed
 *     (later requests on the connection: Bun.serve's idle timeout, serve-http.ts).
 *  3. A connection quiet both ways for `idleTimeoutMs` is closed.
 *  4. Past `maxConnections - healthReserve` open, only `/health` and `/health/live` are let
 *     through (on a connection closed after its answer, so the reserve cannot be held); anything
 *     else gets 503 with Retry-After. Slow clients cannot starve the probes.
 *
 * An admitted connection is spliced, bytes as they come both ways, to Bun.serve on a Unix
 * socket in a directory only this process can enter, so nothing reaches the server past these
 * checks. Each admitted connection holds two descriptors. The hop costs ~30 us a request (0.047
 * against 0.016 ms, 8 kept-alive clients) and 1.24x the wall time of 20 streams of 200 SSE events
 * on loopback (bench/http-guard.ts, on a 2-core Xeon at load 16): small beside a forward pass.
 */
export interface ConnGuardOptions {
  host: string;
  port: number;
  maxConnections: number;
  healthReserve: number;
  headersTimeoutMs: number;
  /** A connection with no byte either way this long is closed (a quiet stream, an idle keep-alive). */
  idleTimeoutMs: number;
}

export interface ConnGuard {
  readonly port: number;
  /** The Unix socket Bun.serve listens on. */
  readonly upstream: string;
  /** Client connections open now. */
  readonly open: number;
  close(): Promise<void>;
}

/** The largest header block read before the request line is judged (Bun's own limit is 16 KiB). */
const MAX_HEAD_BYTES = 64 * 1024;
const HEAD_END = Buffer.from("\r\n\r\n");
const PROBES = new Set(["/health", "/health/live"]);

/** A private directory for the upstream socket; call listen() on the returned path. */
export function upstreamSocketPath(): { path: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "tl-http-"));
  return { path: join(dir, "http.sock"), remove: () => rmSync(dir, { recursive: true, force: true }) };
}

export async function startConnGuard(upstream: string, o: ConnGuardOptions): Promise<ConnGuard> {
  const sockets = new Set<net.Socket>();
  // Their spliced upstream connections, apart: `open` counts clients only.
  const ups = new Set<net.Socket>();
  const server = net.createServer({ pauseOnConnect: false }, (client) => {
    sockets.add(client);
    client.once("close", () => sockets.delete(client));
    client.on("error", () => {});
    if (sockets.size > o.maxConnections) {
      client.destroy();
      return;
    }
    admit(client, upstream, o, () => sockets.size, ups);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as net.AddressInfo).port;
  let closing: Promise<void> | undefined;
  return {
    port,
    upstream,
    get open() {
      return sockets.size;
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of [...sockets, ...ups]) s.destroy();
        sockets.clear();
        ups.clear();
      });
      return closing;
    },
  };
}

/** Reads the first header block under the deadline, judges it (rules 2 and 4), then splices. */
function admit(client: net.Socket, upstream: string, o: ConnGuardOptions, open: () => number, all: Set<net.Socket>): void {
  let head: Buffer = Buffer.alloc(0);
  const timer = setTimeout(() => refuse(client, 408, `request headers not received within ${o.headersTimeoutMs / 1000} s`), o.headersTimeoutMs);
  const onData = (chunk: Buffer) => {
    head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
    const end = head.indexOf(HEAD_END);
    if (end < 0) {
      if (head.length > MAX_HEAD_BYTES) {
        clearTimeout(timer);
        refuse(client, 431, `request headers exceed ${MAX_HEAD_BYTES} bytes`);
      }
      return;
    }
    clearTimeout(timer);
    client.off("data", onData);
    client.pause();
    const line = head.subarray(0, head.indexOf("\r\n")).toString("latin1");
    const path = /^[A-Z]+ (\S+) HTTP\/1\.[01]$/.exec(line)?.[1]?.split("?")[0];
    const crowded = open() > o.maxConnections - o.healthReserve;
    if (crowded && (path === undefined || !PROBES.has(path))) {
      refuse(client, 503, `too many open connections (${o.maxConnections - o.healthReserve} for requests); retry`, { "retry-after": "1" });
      return;
    }
    // A probe let in on the reserve gets its answer and the connection goes: it holds no room.
    splice(client, upstream, crowded ? closeAfter(head, end) : head, all, o.idleTimeoutMs);
  };
  client.on("data", onData);
  client.once("close", () => clearTimeout(timer));
}

/** The head with `connection: close` in place of any connection header the client sent. */
function closeAfter(head: Buffer, end: number): Buffer {
  const lines = head
    .subarray(0, end)
    .toString("latin1")
    .split("\r\n")
    .filter((l, i) => i === 0 || !/^connection\s*:/i.test(l));
  return Buffer.concat([Buffer.from(`${lines.join("\r\n")}\r\nconnection: close`, "latin1"), head.subarray(end)]);
}

/** Bytes both ways until either side ends; each side's end or error ends the other. */
function splice(client: net.Socket, upstream: string, first: Buffer, all: Set<net.Socket>, idleMs: number): void {
  const up = net.connect({ path: upstream });
  all.add(up);
  up.once("close", () => {
    all.delete(up);
    client.destroy();
  });
  up.on("error", () => client.destroy());
  client.once("close", () => up.destroy());
  client.setTimeout(idleMs, () => client.destroy());
  up.write(first);
  client.pipe(up);
  up.pipe(client);
  client.resume();
}

function refuse(client: net.Socket, status: 408 | 431 | 503, message: string, headers: Record<string, string> = {}): void {
  const reason = { 408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable" }[status];
  const body = JSON.stringify({ error: { message, type: status === 503 ? "server_error" : "invalid_request_error", param: null, code: status } });
  const extra = Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  client.end(
    `HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}connection: close\r\n\r\n${body}`,
  );
  // A client that never reads its answer does not keep the socket.
  setTimeout(() => client.destroy(), 1000).unref();
}
