import * as http2 from "node:http2";
import type { DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { channelKey, secureSessionOptions, type ClientTls } from "./tls-client.ts";

export interface GrpcClientOptions {
  /** Deadline applied to every call that does not pass its own `timeoutMs`. */
  timeoutMs?: number;
  /** Dial over mutual TLS, the server's role checked at the handshake (src/rpc); h2c when absent. */
  tls?: ClientTls;
}

interface Channel {
  readonly transport: Transport;
  readonly session: Http2SessionManager;
  readonly target: string;
}

// One HTTP/2 connection per target, shared by every client of every service on it:
// a heartbeat, a Prefill and a PushKv to the same engine ride the same socket.
const channels = new Map<string, Channel>();

/**
 * Bun (1.4) closes a client stream whose request side has ended with rstCode 0
 * (NO_ERROR) and no error when the server resets it or the connection drops.
 * Connect maps only non-zero reset codes to errors, so such a unary call would
 * wait for its deadline, or forever without one. A stream that closes without
 * a response is a failure whatever its code: say so.
 */
class ClosingAwareSessionManager extends Http2SessionManager {
  override async request(
    method: string,
    path: string,
    headers: http2.OutgoingHttpHeaders,
    options: Omit<http2.ClientSessionRequestOptions, "signal">,
  ): Promise<http2.ClientHttp2Stream> {
    const stream = await super.request(method, path, headers, options);
    let responded = false;
    stream.once("response", () => {
      responded = true;
    });
    stream.once("close", () => {
      if (!responded && stream.rstCode === http2.constants.NGHTTP2_NO_ERROR) {
        stream.emit("error", new ConnectError(`http/2 stream to ${this.authority} closed before a response`, Code.Unavailable));
      }
    });
    return stream;
  }
}

function channel(target: string, tls: ClientTls | undefined): Channel {
  const key = channelKey(target, tls);
  let ch = channels.get(key);
  if (ch === undefined) {
    const baseUrl = `${tls ? "https" : "http"}://${target}`;
    // The manager reconnects by itself after a broken connection, so a cached
    // channel to a restarted peer heals on the next call. Idle connections are
    // unref'd and do not keep the process alive. (A rotated certificate is a new
    // key, hence a new channel; the old one idles out.)
    const session = new ClosingAwareSessionManager(baseUrl, undefined, tls ? secureSessionOptions(tls, target) : undefined);
    const transport = createGrpcTransport({ baseUrl, sessionManager: session });
    ch = { transport, session, target };
    channels.set(key, ch);
  }
  return ch;
}

/**
 * A gRPC (h2c) client for `service` at `target` ("host:port"). Clients for the
 * same target share one cached connection; `opts.timeoutMs` is per client.
 */
export function grpcClient<T extends DescService>(service: T, target: string, opts: GrpcClientOptions = {}): Client<T> {
  const { transport } = channel(target, opts.tls);
  const defaultTimeout = opts.timeoutMs;
  if (defaultTimeout === undefined) return createClient(service, transport);
  const timed: Transport = {
    unary: (method, signal, timeoutMs, header, input, contextValues) =>
      transport.unary(method, signal, timeoutMs ?? defaultTimeout, header, input, contextValues),
    stream: (method, signal, timeoutMs, header, input, contextValues) =>
      transport.stream(method, signal, timeoutMs ?? defaultTimeout, header, input, contextValues),
  };
  return createClient(service, timed);
}

/**
 * Closes the cached connection to `target` (every target when omitted); calls in
 * flight on it fail. A later grpcClient() for the target dials afresh.
 */
export function closeGrpcClients(target?: string): void {
  for (const [key, ch] of channels) {
    if (target !== undefined && ch.target !== target) continue;
    ch.session.abort();
    channels.delete(key);
  }
}
