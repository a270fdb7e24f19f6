import type { KvAckLike, KvChunkLike } from "./kv-chunk.ts";

/**
 * How the prefill side reaches a decode engine's KvTransfer. Implementations throw
 * TransferError (with the gRPC code) on every failure.
 */
export interface KvTransport {
  hasBlocks(target: string, hashes: readonly bigint[], kvFormat: number): Promise<boolean[]>;
  /** One whole push; `signal` abandons it (D frees what it took). */
  push(target: string, chunks: readonly KvChunkLike[] | AsyncIterable<KvChunkLike>, opts?: PushOptions): Promise<KvAckLike>;
  /** Frees a handle D holds for a push whose caller is gone; false when D does not hold it. Optional. */
  release?(target: string, handleId: string): Promise<boolean>;
  /** Closes every cached connection. */
  close(): Promise<void>;
}

export interface PushOptions {
  signal?: AbortSignal;
  /** W3C traceparent naming the sender's span: gRPC metadata, or the data plane's TRACE frame. */
  traceparent?: string;
}
