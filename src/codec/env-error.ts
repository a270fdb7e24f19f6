// Why an envelope was refused (kv-block.md, "What a reader checks"): the kind decides the
// gRPC status, the rule number which check failed.

export type EnvErrorKind = "Format" | "Version" | "Shape";

/**
 * The gRPC status numbers kv-block.md gives a refused envelope. The codec is pure core
 * and never sees Connect; these equal its `Code.FailedPrecondition` and `Code.DataLoss`
 * (test/rpc/status.test.ts), the one code vocabulary above it (src/rpc/status.ts).
 */
const GRPC_FAILED_PRECONDITION = 9;
const GRPC_DATA_LOSS = 15;
export type EnvCode = typeof GRPC_FAILED_PRECONDITION | typeof GRPC_DATA_LOSS;

/** Format is corruption (retry elsewhere); Version and Shape mean this worker will never read it. */
export function grpcCodeOf(kind: EnvErrorKind): EnvCode {
  return kind === "Format" ? GRPC_DATA_LOSS : GRPC_FAILED_PRECONDITION;
}

export function grpcCodeNameOf(kind: EnvErrorKind): "DATA_LOSS" | "FAILED_PRECONDITION" {
  return kind === "Format" ? "DATA_LOSS" : "FAILED_PRECONDITION";
}

export class EnvError extends Error {
  override readonly name = "EnvError";
  readonly kind: EnvErrorKind;
  readonly rule: number;
  /** grpcCodeOf(kind). */
  readonly code: EnvCode;

  constructor(kind: EnvErrorKind, rule: number, detail: string) {
    super(`rule ${rule}: ${detail}`);
    this.kind = kind;
    this.rule = rule;
    this.code = grpcCodeOf(kind);
  }
}

export function hex32(v: number): string {
  return "0x" + (v >>> 0).toString(16).padStart(8, "0");
}

export function hex64(v: bigint): string {
  return "0x" + v.toString(16).padStart(16, "0");
}
