import { promptHashes } from "../codec/index.ts";
import type { KvReceiver } from "../transfer/index.ts";

/** Why a resume cannot take a handle over. */
export class ResumeError extends Error {
  override readonly name = "ResumeError";
  constructor(
    /** unknown: no such handle (never pushed, claimed, released or expired); mismatch: it holds another prompt */
    readonly kind: "unknown" | "mismatch",
    message: string,
  ) {
    super(message);
  }
}

/**
 * The decode engine's half of the hand-off: takes the handle's blocks over for a request
 * whose prompt is `promptTokens`, after checking the handle holds exactly that prompt
 * (its token count and every full block's chained hash). The caller owns one reference
 * on each returned block; a mismatch gives the blocks back before it throws.
 */
export function claimForResume(receiver: KvReceiver, handleId: string, promptTokens: readonly number[]): number[] {
  const claimed = receiver.claim(handleId);
  if (!claimed) throw new ResumeError("unknown", `kv handle ${JSON.stringify(handleId)} is unknown or expired`);
  const want = promptHashes(promptTokens, receiver.pool.shape.blockTokens);
  const hashesMatch = want.length === claimed.hashes.length && want.every((h, i) => h === claimed.hashes[i]);
  if (!hashesMatch || claimed.nTokens !== promptTokens.length) {
    receiver.pool.releaseAll(claimed.blockIds);
    throw new ResumeError(
      "mismatch",
      `kv handle ${JSON.stringify(handleId)} holds ${claimed.nTokens} tokens in ${claimed.hashes.length} full blocks; the prompt has ${promptTokens.length} tokens and its block hashes ${hashesMatch ? "match" : "differ"}`,
    );
  }
  return claimed.blockIds;
}
