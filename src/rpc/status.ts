// The one status vocabulary of every RPC path: Connect's `Code` (its numbers are the
// gRPC status numbers, so the data plane's ERROR frame and grpc-status trailers carry
// them as they are), the gRPC names messages use, and the one mapping between gRPC
// codes and HTTP statuses in each direction.
import { Code } from "@connectrpc/connect";

export { Code };

const NAMES: Record<number, string> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** The gRPC name of a status code ("DATA_LOSS"), as error messages and logs print it. */
export function codeName(code: number): string {
  return NAMES[code] ?? `CODE_${code}`;
}

/**
 * The HTTP status a client of the gateway sees for a failed internal call: the caller's
 * mistakes as 4xx, a cluster with no room or no one to serve as 503/429, the rest as a
 * bad gateway.
 */
export function httpStatusOf(code: Code): number {
  switch (code) {
    case Code.InvalidArgument:
      return 400;
    case Code.NotFound:
      return 404;
    case Code.AlreadyExists:
      return 409;
    case Code.ResourceExhausted:
      return 429;
    case Code.Unavailable:
    case Code.FailedPrecondition:
      return 503;
    case Code.DeadlineExceeded:
      return 504;
    default:
      return 502;
  }
}

/** gRPC's mapping of the HTTP statuses a proxy may answer a gRPC call with. */
export function codeOfHttpStatus(status: number): Code {
  if (status === 429 || status === 502 || status === 503 || status === 504) return Code.Unavailable;
  if (status === 400) return Code.Internal;
  return Code.Unknown;
}
