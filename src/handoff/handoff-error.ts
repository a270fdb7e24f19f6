import { type Code, RpcError } from "../rpc/status.ts";

/** Which engine of a hand-off failed it: the prefill engine's own work, or the decode engine taking the blocks. */
export type FailedSide = "prefill" | "decode";

/**
 * The gRPC response metadata (a trailer of the Prefill call) naming the side that
 * failed, so the gateway blames the right engine without reading message text.
 */
export const FAILED_SIDE_HEADER = "tl-failed-side";

/**
 * A failed hand-off: the gRPC code, and which side failed as a field, which also travels
 * as the response metadata FAILED_SIDE_HEADER when a Connect handler throws it.
 */
export class HandoffError extends RpcError {
  constructor(
    readonly side: FailedSide,
    code: Code,
    message: string,
  ) {
    super(code, message, { [FAILED_SIDE_HEADER]: side });
  }
}

/** The side a Prefill error's metadata names; "prefill" when it names none (a refusal before any push). */
export function failedSideOf(metadata: Headers): FailedSide {
  return metadata.get(FAILED_SIDE_HEADER) === "decode" ? "decode" : "prefill";
}
