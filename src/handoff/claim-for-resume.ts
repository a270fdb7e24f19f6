import { promptHashes } from "../codec/index.ts";
import type { KvReceiver } from "../transfer/index.ts";
import { Code, RpcError } from "../rpc/status.ts";

/** Why a resume cannot take a handle over: NOT_FOUND (kind unknown) or FAILED_PRECONDITION (mismatch). */
export class ResumeError extends RpcError {
  constructor(
    /** unknown: no such handle (never pushed, claimed, released or expired); mismatch: it holds another prompt */
    readonly kind: "unknown" | "mismatch",
    message: string,
  ) {
    super(kind === "unknown" ? Code.NotFound : Code.FailedPrecondition, message);
  }
}

/**
 * The decode engine's half of the hand-off: takes the handle's blocks over for a request
 * whose prompt is `promptTokens`, after checking the handle holds exactly that prompt
 * (its token count and every full block's chained hash). The caller owns one reference
 * on each returned block. A mismatch leaves the handle pending for the right resume:
 * whoever holds a handle id cannot destroy another request's KV by misusing it. Messages
 * never repeat the handle id (a capability).
 */
export function claimForResume(receiver: KvReceiver, handleId: string, promptTokens: readonly number[]): number[] {
  const want = promptHashes(promptTokens, receiver.pool.shape.blockTokens);
  const claimed = receiver.claim(handleId, (h) => {
    const hashesMatch = want.length === h.hashes.length && want.every((x, i) => x === h.hashes[i]);
    if (hashesMatch && h.nTokens === promptTokens.length) return null;
    return `kv handle holds ${h.nTokens} tokens in ${h.hashes.length} full blocks; the prompt has ${promptTokens.length} tokens and its block hashes ${hashesMatch ? "match" : "differ"}`;
  });
  if (!claimed) throw new ResumeError("unknown", "kv handle is unknown or expired");
  if ("fault" in claimed) throw new ResumeError("mismatch", claimed.fault);
  return claimed.blockIds;
}
