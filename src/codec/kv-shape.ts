/** The shape of one KV-cache block: B tokens, L layers, H KV heads, D head dim (kv-block.md). */
export interface KvShape {
  blockTokens: number;
  nLayers: number;
  nKvHeads: number;
  headDim: number;
}

/** P = 2·L·H·B·D·2: K and V of every layer, f16. */
export function blockPayloadBytes(s: KvShape): number {
  return 2 * s.nLayers * s.nKvHeads * s.blockTokens * s.headDim * 2;
}

/** E = 28 + n·(12 + P) + 4. */
export function envelopeBytes(s: KvShape, nBlocks: number): number {
  return 28 + nBlocks * (12 + blockPayloadBytes(s)) + 4;
}

/**
 * Copies a block's payload to `out[o, o + P)` at fill `fill`: per layer K then V, each
 * [B][H][D], the first `fill` token slots as given and the rest as zeros, whatever
 * `payload` holds there. The one place a partial block's dead slots are zeroed: the
 * envelope writers and the pool's import path all copy through it.
 */
export function copyPayload(out: Uint8Array, o: number, payload: Uint8Array, fill: number, s: KvShape): void {
  if (fill === s.blockTokens) {
    out.set(payload, o);
    return;
  }
  const slot = s.nKvHeads * s.headDim * 2;
  const section = s.blockTokens * slot;
  const used = fill * slot;
  for (let p = 0; p < payload.length; p += section) {
    out.set(payload.subarray(p, p + used), o + p);
    out.fill(0, o + p + used, o + p + section);
  }
}

/**
 * The kv_format every contract message names (tl.kv.v1, tl.engine.v1, tl.control.v1):
 * 1 is the v1 envelope of kv-block.md with f16 payloads, the only format this engine speaks.
 */
export const KV_FORMAT = 1;
