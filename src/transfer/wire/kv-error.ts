// The two errors of a push, one per side: RpcErrors (src/rpc/status.ts, "One error
// vocabulary") with a gRPC `Code` whichever transport carried them (gRPC, or the data
// plane's ERROR frame, which carries the same numbers); `rawMessage` is what goes on a
// wire, `message` ("[data_loss] chunk 3: ...") what a log prints.
import { Code, RpcError } from "../../rpc/status.ts";

/** A refusal by the decode side's receiver. */
export class KvError extends RpcError {}

/** A failed transfer on the prefill side; `code` is the gRPC status the peer (or the transport) reported. */
export class TransferError extends RpcError {}

/** `e` as a failed transfer: a TransferError as it is, anything else INTERNAL naming `what`. */
export function transferError(e: unknown, what: string): TransferError {
  if (e instanceof TransferError) return e;
  return new TransferError(Code.Internal, `${what}: ${e instanceof Error ? e.message : String(e)}`);
}
