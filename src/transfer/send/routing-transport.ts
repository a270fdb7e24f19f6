import type * as http2 from "node:http2";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { type KvChunkSchema, KvTransfer } from "../../gen/tl/kv/v1/kv_pb.ts";
import { type KvAckLike, type KvChunkLike, TransferError, transferError } from "../wire/index.ts";
import { log } from "../../obs/index.ts";
import type { BlockPresence, KvTransport, PushOptions, PushRoute } from "./kv-transport.ts";
import { DataPlaneClient } from "./data-plane-client.ts";
import { DECODE_TARGET_ROLES } from "../../rpc/peer-policy.ts";
import { channelKey, secureSessionOptions } from "../../rpc/tls-client.ts";
import type { TlsSource } from "../../rpc/tls-config.ts";

export interface RoutingTransportOptions {
  /** Deadline of each call; default 30 000 ms. */
  timeoutMs?: number;
  /** Largest message sent or accepted; default 64 MiB. */
  maxMessageBytes?: number;
  /**
   * Push over the decode engine's binary data plane when its HasBlocks answer
   * advertises one (default: a DataPlaneClient of its own); false keeps every push on gRPC.
   */
  dataPlane?: DataPlaneClient | false;
  /** Mutual TLS to decode engines: the handshake fails unless the target's certificate names decode (or both). */
  tls?: TlsSource;
}

// One HTTP/2 stream carries a whole push: windows far above the 64 KiB default let it
// run at loopback speed instead of one window per round trip.
const WINDOW_BYTES = 32 * 1024 * 1024;

/**
 * KvTransport over tl.kv.v1: HasBlocks and Release over gRPC (Connect, one cached HTTP/2
 * client per target), pushes along the route HasBlocks chose: the binary data plane a
 * decode engine advertises when this transport uses data planes, else gRPC PushKv.
 */
export class RoutingTransport implements KvTransport {
  private readonly clients = new Map<string, { client: Client<typeof KvTransfer>; session: Http2SessionManager }>();
  private readonly sessions: Http2SessionManager[] = [];
  private readonly timeoutMs: number;
  private readonly maxBytes: number;
  private readonly dp: DataPlaneClient | false;
  private readonly tls: TlsSource | undefined;

  constructor(opts: RoutingTransportOptions = {}) {
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.maxBytes = opts.maxMessageBytes ?? 64 * 1024 * 1024;
    this.tls = opts.tls;
    this.dp = opts.dataPlane ?? new DataPlaneClient({ timeoutMs: this.timeoutMs, ...(opts.tls ? { tls: opts.tls } : {}) });
  }

  private client(target: string): Client<typeof KvTransfer> {
    return this.connection(target).client;
  }

  private connection(target: string): { client: Client<typeof KvTransfer>; session: Http2SessionManager } {
    const tls = this.tls === undefined ? undefined : { source: this.tls, expect: DECODE_TARGET_ROLES };
    const key = channelKey(target, tls);
    let c = this.clients.get(key);
    if (c === undefined) {
      const baseUrl = `${tls ? "https" : "http"}://${target}`;
      // Our own session manager, so close() can end the connection.
      const sessionManager = new Http2SessionManager(baseUrl, { idleConnectionTimeoutMs: 60_000 }, {
        settings: { initialWindowSize: WINDOW_BYTES, maxFrameSize: 16 * 1024 * 1024 - 1 },
        maxSessionMemory: 256,
        ...(tls ? secureSessionOptions(tls, target) : {}),
      } satisfies http2.ClientSessionOptions);
      this.sessions.push(sessionManager);
      const transport = createGrpcTransport({
        baseUrl,
        sessionManager,
        readMaxBytes: this.maxBytes,
        writeMaxBytes: this.maxBytes,
        defaultTimeoutMs: this.timeoutMs,
      });
      c = { client: createClient(KvTransfer, transport), session: sessionManager };
      this.clients.set(key, c);
    }
    return c;
  }

  async hasBlocks(target: string, hashes: readonly bigint[], kvFormat: number): Promise<BlockPresence> {
    try {
      const res = await this.client(target).hasBlocks({ hashes: hashes as bigint[], kvFormat });
      if (res.present.length !== hashes.length) {
        throw new TransferError(Code.Internal, `HasBlocks answered ${res.present.length} flags for ${hashes.length} hashes`);
      }
      const route: PushRoute =
        res.dataPlaneAddress !== "" && this.dp !== false ? { target, via: "data-plane", address: res.dataPlaneAddress } : { target, via: "grpc" };
      return { present: res.present, route };
    } catch (e) {
      throw brokenOrTransferError(e, `HasBlocks to ${target}`);
    }
  }

  /**
   * Pushes along `route`. The data plane is a faster road to the same server, not another
   * server: when it cannot be reached or its connection breaks (UNAVAILABLE: refused, reset,
   * no handshake; D frees what a broken push took), a push whose chunks can be read again (a
   * list) goes over gRPC before it fails. Refusals D itself sends (DATA_LOSS, ...) are answers,
   * not broken roads, and are not retried.
   */
  async push(route: PushRoute, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts: PushOptions = {}): Promise<KvAckLike> {
    if (route.via === "data-plane") {
      if (this.dp === false) throw new TransferError(Code.FailedPrecondition, `push to ${route.target}: this transport does not use data planes`);
      try {
        return await this.dp.push(route.address, chunks, opts);
      } catch (e) {
        const err = transferError(e, `data plane push to ${route.address}`);
        if (err.code !== Code.Unavailable || opts.signal?.aborted || !Array.isArray(chunks)) throw err;
        this.dataPlaneFallbacks++;
        log.warn("data plane push failed; pushing over gRPC", { target: route.target, data_plane: route.address, error: err.message });
        try {
          return await this.grpcPush(route.target, chunks, opts);
        } catch (e2) {
          // D holds the handle already: the data plane push went through and only its ack was
          // lost. The caller releases it on the data plane's error, as before this fallback.
          const again = transferError(e2, `push to ${route.target} after the data plane failed`);
          throw again.code === Code.AlreadyExists ? err : again;
        }
      }
    }
    return this.grpcPush(route.target, chunks, opts);
  }

  /** Pushes that went over gRPC after the data plane failed them (see push). */
  dataPlaneFallbacks = 0;

  /**
   * PushKv through Connect's generated client. This is the road when D has no data plane
   * (or this transport uses none) and the fallback of a broken data plane push; the data
   * plane is the fast path (ARCHITECTURE.md, "Two roads for a push").
   */
  private async grpcPush(target: string, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts: PushOptions): Promise<KvAckLike> {
    const what = `PushKv to ${target}`;
    if (opts.signal?.aborted) throw new TransferError(Code.Canceled, `${what}: cancelled`);
    try {
      const ack = await this.client(target).pushKv(messages(chunks, opts.owner), {
        timeoutMs: this.timeoutMs,
        ...(opts.signal ? { signal: opts.signal } : {}),
        ...(opts.traceparent !== undefined ? { headers: { traceparent: opts.traceparent } } : {}),
      });
      return {
        handleId: ack.handleId,
        blocksReceived: ack.blocksReceived,
        blocksDeduped: ack.blocksDeduped,
        payloadBytes: ack.payloadBytes,
        nTokens: ack.nTokens,
      };
    } catch (e) {
      throw brokenOrTransferError(e, what, opts.signal);
    }
  }

  /** Release a pending handle on `target` (the gateway's call when its client went away). */
  async release(target: string, handleId: string): Promise<boolean> {
    try {
      return (await this.client(target).release({ handleId })).released;
    } catch (e) {
      throw toTransferError(e, `Release to ${target}`);
    }
  }

  async close(): Promise<void> {
    for (const s of this.sessions) s.abort();
    this.sessions.length = 0;
    this.clients.clear();
    if (this.dp !== false) await this.dp.close();
  }
}

/**
 * The chunks as KvChunk messages, the gateway replica's id on the first only (the
 * receiver binds the push to it when it opens). A chunk's envelope is read once, here.
 */
async function* messages(chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, owner?: string): AsyncIterable<MessageInitShape<typeof KvChunkSchema>> {
  let first = true;
  for await (const c of chunks) {
    const m = { handleId: c.handleId, index: c.index, total: c.total, hash: c.hash, kvFormat: c.kvFormat, envelope: c.envelope, crc32c: c.crc32c };
    yield first && owner ? { ...m, owner } : m;
    first = false;
  }
}

/**
 * A connection that breaks under a call (a reset HTTP/2 stream, a read ECONNRESET)
 * surfaces from Connect as CANCELLED or ABORTED. Unless we cancelled, it is the peer
 * being unreachable, which callers retry elsewhere: UNAVAILABLE. (D itself answers
 * neither to a caller that is still there.)
 */
function brokenOrTransferError(e: unknown, what: string, signal?: AbortSignal): TransferError {
  if (e instanceof ConnectError && (e.code === Code.Canceled || e.code === Code.Aborted) && !signal?.aborted) {
    return new TransferError(Code.Unavailable, `${what}: connection broke (${Code[e.code]}): ${e.rawMessage}`);
  }
  return toTransferError(e, what);
}

/** A Connect error with its code; anything else as transferError() has it. */
function toTransferError(e: unknown, what: string): TransferError {
  if (e instanceof TransferError) return e;
  if (e instanceof ConnectError) return new TransferError(e.code, `${what}: ${e.rawMessage}`);
  return transferError(e, what);
}
