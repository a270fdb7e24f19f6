// The one status vocabulary of every RPC path: Connect's `Code` (its numbers are the
// gRPC status numbers, so the data plane's ERROR frame and grpc-status trailers carry
// them as they are), one error type (Connect's `ConnectError`, and `RpcError` for ours),
// the gRPC names messages use, and the one mapping from a code to the HTTP status a
// gateway's client sees. (The other direction, an HTTP status without a grpc-status,
// Connect's client maps as gRPC's doc/http-grpc-status-mapping.md says:
// test/transfer/http-status.test.ts.)
//
// One error vocabulary above the pure core: every error that carries a status is a
// ConnectError, so it has a `Code`, `rawMessage` (what a wire or a peer gets) and
// `message` ("[data_loss] chunk 3: crc mismatch", what logs print), and a Connect
// handler answers it with its code as thrown. Ours are `RpcError`s: KvError (D refuses a
// push), TransferError (P's push failed), HandoffError (a hand-off failed, and which side).
// Below this floor errors carry no status: the pure core's (EnvError's kind and rule,
// LogitsError, ModelFormatError, ...) and the leaves' (ConstraintError, TlsConfigError,
// ConfigError) say what broke, and the adapter that catches one gives it its code or
// HTTP status. EnvError alone names a gRPC number (kv-block.md's contract: Format is
// DATA_LOSS, the rest FAILED_PRECONDITION), as a plain number: the codec never sees
// Connect. The HTTP adapters' `HttpError` is the client-facing end: an HTTP status and
// OpenAI's error type, with a message that names no internal address.
import { Code, ConnectError } from "@connectrpc/connect";

export { Code, ConnectError };

/**
 * A ConnectError of ours, told apart by its class. (ConnectError's own `instanceof`
 * accepts any error shaped like one, so that errors cross copies of the package; a
 * subclass inheriting that would take a TransferError for a KvError.) `name` stays
 * "ConnectError": Connect recognizes a thrown error by it and answers with its code.
 */
export class RpcError extends ConnectError {
  constructor(code: Code, message: string, metadata?: Record<string, string>) {
    super(message, code, metadata);
  }

  static override [Symbol.hasInstance](v: unknown): boolean {
    // biome-ignore lint/complexity/noThisInStatic: `this` is the subclass asked about (KvError, TransferError, ...)
    return Function.prototype[Symbol.hasInstance].call(this, v);
  }
}

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
 * bad gateway. Not gRPC's own table (NOT_FOUND 404, UNAUTHENTICATED 401, ...): those say
 * what the *caller* did, and here the caller is the gateway, not its client. A block D
 * evicted mid-push (NOT_FOUND), a handle id taken (ALREADY_EXISTS), or a certificate an
 * engine refused (PERMISSION_DENIED) is the cluster's failure, never the client's 404,
 * 409 or 403.
 */
export function httpStatusOf(code: Code): number {
  switch (code) {
    case Code.InvalidArgument:
      return 400;
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
