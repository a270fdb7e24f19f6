import type { KvAckLike, KvChunkLike } from "../wire/index.ts";

/**
 * The path a push to a decode engine takes, chosen from its HasBlocks answer: gRPC
 * PushKv at its KvTransfer address, or the binary data plane it advertised.
 */
export type PushRoute = { readonly target: string; readonly via: "grpc" } | { readonly target: string; readonly via: "data-plane"; readonly address: string };

/** What D answers to HasBlocks: which hashes it holds, and the route a push to it takes. */
export interface BlockPresence {
  present: boolean[];
  route: PushRoute;
}

/**
 * How the prefill side reaches a decode engine's KvTransfer. Implementations throw
 * TransferError (with the gRPC code) on every failure.
 */
export interface KvTransport {
  hasBlocks(target: string, hashes: readonly bigint[], kvFormat: number): Promise<BlockPresence>;
  /** One whole push along `route` (from hasBlocks); `signal` abandons it (D frees what it took). */
  push(route: PushRoute, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts?: PushOptions): Promise<KvAckLike>;
  /** Frees a handle D holds for a push whose caller is gone; false when D does not hold it. Optional. */
  release?(target: string, handleId: string): Promise<boolean>;
  /** Closes every cached connection. */
  close(): Promise<void>;
}

export interface PushOptions {
  signal?: AbortSignal;
  /** W3C traceparent naming the sender's span: gRPC metadata, or the data plane's TRACE frame. */
  traceparent?: string;
  /** The gateway replica the push was asked for: KvChunk.owner, or the data plane's OWNER frame. */
  owner?: string;
}
