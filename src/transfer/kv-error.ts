// The decode side's receiver and the prefill side's transfer are kept free of Connect
// so they can be driven by either transport (gRPC or the binary data plane); they
// speak gRPC status numbers, which equal Connect's `Code` values.

/** gRPC status codes used by the KV transfer paths. */
export const GrpcCode = {
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
} as const;

const NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(GrpcCode).map(([k, v]) => [v, k]),
);

export function grpcCodeName(code: number): string {
  return NAMES[code] ?? `CODE_${code}`;
}

/** A refusal by the decode side's receiver. */
export class KvError extends Error {
  override readonly name = "KvError";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

/** A failed transfer on the prefill side; `code` is the gRPC status the peer (or the transport) reported. */
export class TransferError extends Error {
  override readonly name = "TransferError";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(`${grpcCodeName(code)}: ${message}`);
  }
}

export function hex32(v: number): string {
  return "0x" + (v >>> 0).toString(16).padStart(8, "0");
}

export function hex64(v: bigint): string {
  return "0x" + v.toString(16).padStart(16, "0");
}
