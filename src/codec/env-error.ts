// Why an envelope was refused (kv-block.md, "What a reader checks"): the kind decides the
// gRPC status, the rule number which check failed.

export type EnvErrorKind = "Format" | "Version" | "Shape";

/** gRPC status codes used here; the numbers equal Connect's `Code` enum values. */
const GRPC_FAILED_PRECONDITION = 9;
const GRPC_DATA_LOSS = 15;

/** Format is corruption (retry elsewhere); Version and Shape mean this worker will never read it. */
export function grpcCodeOf(kind: EnvErrorKind): number {
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
  readonly code: number;

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
