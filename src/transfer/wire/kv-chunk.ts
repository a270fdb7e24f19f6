/**
 * One KvChunk of a push (grpc-services.md, "tl.kv.v1 · KvTransfer"), transport-neutral: the generated
 * `KvChunk` message satisfies it, and so do the data plane's decoded frames.
 */
export interface KvChunkLike {
  handleId: string;
  index: number;
  total: number;
  /** the block's chained hash; 0n for the partial tail */
  hash: bigint;
  kvFormat: number;
  /** a one-block envelope; empty = "you hold it, take a reference" */
  envelope: Uint8Array;
  /** CRC-32C of `envelope`; 0 when empty */
  crc32c: number;
  /** the gateway replica the push was asked for (KvChunk.owner; the data plane's OWNER frame) */
  owner?: string;
}

/** What D answers to a whole push (the KvAck message, transport-neutral). */
export interface KvAckLike {
  handleId: string;
  blocksReceived: number;
  blocksDeduped: number;
  payloadBytes: bigint;
  nTokens: number;
}

/** The attributes a decode side's kv.transfer span gets for an accepted push. */
export function ackSpanAttributes(ack: KvAckLike): Record<string, string | number> {
  return {
    "tl.kv.handle": ack.handleId,
    "tl.kv.blocks_sent": ack.blocksReceived,
    "tl.kv.blocks_deduped": ack.blocksDeduped,
    "tl.kv.payload_bytes": Number(ack.payloadBytes),
  };
}
