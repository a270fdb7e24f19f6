// The decode side's receiver and the prefill side's transfer speak gRPC status codes
// (Connect's `Code`, src/rpc/status.ts) whichever transport carries them: gRPC or the
// binary data plane.
import { Code, codeName } from "../../rpc/status.ts";

/** A refusal by the decode side's receiver. */
export class KvError extends Error {
  override readonly name = "KvError";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }

  /** `e` as a refusal: itself, or INTERNAL with its message (a bug, not a verdict). */
  static from(e: unknown): KvError {
    return e instanceof KvError ? e : new KvError(Code.Internal, e instanceof Error ? e.message : String(e));
  }
}

/** `e` as a failed transfer: a TransferError as it is, anything else INTERNAL naming `what`. */
export function transferError(e: unknown, what: string): TransferError {
  if (e instanceof TransferError) return e;
  return new TransferError(Code.Internal, `${what}: ${e instanceof Error ? e.message : String(e)}`);
}

/** A failed transfer on the prefill side; `code` is the gRPC status the peer (or the transport) reported. */
export class TransferError extends Error {
  override readonly name = "TransferError";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(`${codeName(code)}: ${message}`);
  }
}
