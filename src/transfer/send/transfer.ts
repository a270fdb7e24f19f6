import { KV_FORMAT } from "../../codec/index.ts";
import type { KvPool } from "../../pool/index.ts";
import { chunkSlabBytes, poolChunks } from "./build-chunks.ts";
import { transferError } from "../wire/index.ts";
import { Code } from "../../rpc/status.ts";
import type { KvTransport } from "./kv-transport.ts";

export interface TransferStats {
  /** envelopes D imported */
  blocksSent: number;
  /** empty chunks D served from its cache */
  blocksDeduped: number;
  /** envelope bytes D received */
  payloadBytes: number;
  /** tokens the handle holds on D */
  nTokens: number;
}

/**
 * Pushes a prompt's KV blocks to a decode engine under `handleId`: HasBlocks, then one
 * PushKv with the present blocks as empty chunks and the rest as envelopes; if D
 * evicted a block between the two (NOT_FOUND), the whole push once more with every
 * payload.
 *
 * Consumes the caller's references on `ids`: they are released after the push and,
 * on any failure, before the TransferError reaches the caller (full blocks stay in
 * P's prefix cache).
 */
// Envelope buffers of finished pushes, reused: a fresh multi-megabyte buffer per push
// costs more in page faults than writing the envelopes into it.
const spareSlabs: Uint8Array[] = [];
const MAX_SPARE = 4;
const MAX_SPARE_BYTES = 64 * 1024 * 1024;

function takeSlab(bytes: number): Uint8Array {
  for (let i = 0; i < spareSlabs.length; i++) {
    if (spareSlabs[i]!.length >= bytes) return spareSlabs.splice(i, 1)[0]!;
  }
  return new Uint8Array(bytes);
}

function giveSlab(slab: Uint8Array): void {
  if (slab.length <= MAX_SPARE_BYTES && spareSlabs.length < MAX_SPARE) spareSlabs.push(slab);
}

export async function transfer(
  transport: KvTransport,
  target: string,
  pool: KvPool,
  handleId: string,
  ids: readonly number[],
  hashes: readonly bigint[],
  /** W3C traceparent of the caller's kv.transfer span, carried to D with each push. */
  traceparent?: string,
  /** The gateway replica the push is for (PrefillRequest.gateway_id): D binds the handle to it. */
  owner?: string,
): Promise<TransferStats> {
  const pushOpts = { ...(traceparent === undefined ? {} : { traceparent }), ...(owner ? { owner } : {}) };
  let slab: Uint8Array | undefined;
  try {
    const { present, route } = await transport.hasBlocks(target, hashes, KV_FORMAT);
    const all = present.map(() => false);
    // Taken only when the transport asks for envelope bytes (gRPC); the data plane
    // writes them from the pool into its send buffer. Sized for the resend too, which
    // carries every payload.
    const getSlab = () => (slab ??= takeSlab(chunkSlabBytes(pool, ids.length, hashes.length, all)));
    let ack;
    try {
      ack = await transport.push(route, poolChunks(pool, handleId, ids, hashes, present, getSlab), pushOpts);
    } catch (e) {
      const err = transferError(e, `push ${handleId}`);
      if (err.code !== Code.NotFound) throw err;
      ack = await transport.push(route, poolChunks(pool, handleId, ids, hashes, all, getSlab), pushOpts);
    }
    return {
      blocksSent: ack.blocksReceived,
      blocksDeduped: ack.blocksDeduped,
      payloadBytes: Number(ack.payloadBytes),
      nTokens: ack.nTokens,
    };
  } catch (e) {
    throw transferError(e, `transfer ${handleId} to ${target}`);
  } finally {
    pool.releaseAll(ids);
    if (slab !== undefined) giveSlab(slab);
  }
}
