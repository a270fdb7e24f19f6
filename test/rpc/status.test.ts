// The one error vocabulary (src/rpc/status.ts): every error with a status is a
// ConnectError with Connect's Code; ours are told apart by class; a Connect handler
// answers one with its code, raw message and metadata as thrown; and what a gateway's
// client hears of a failed internal call.
import { expect, test } from "bun:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { EnvError, grpcCodeOf } from "../../src/codec/index.ts";
import { prefillFailure } from "../../src/gateway/completions.ts";
import { FAILED_SIDE_HEADER, HandoffError, ResumeError } from "../../src/handoff/index.ts";
import { codeName, httpStatusOf, RpcError } from "../../src/rpc/status.ts";
import { KvError, TransferError } from "../../src/transfer/index.ts";

test("our errors are connect errors told apart by class", () => {
  const kv = new KvError(Code.DataLoss, "chunk 3: crc mismatch");
  const tx = new TransferError(Code.Unavailable, "data plane 10.0.0.5:7000: connection closed");
  const plain = new ConnectError("boom", Code.Internal);
  // One message format: Connect's, the raw message apart for wires and clients.
  expect([kv.message, kv.rawMessage, kv.code]).toEqual(["[data_loss] chunk 3: crc mismatch", "chunk 3: crc mismatch", Code.DataLoss]);
  for (const e of [kv, tx]) {
    expect(e instanceof ConnectError).toBe(true);
    expect(e instanceof RpcError).toBe(true);
    // Connect answers a thrown one as it is: its code, not UNKNOWN.
    expect(ConnectError.from(e)).toBe(e);
  }
  expect([kv instanceof KvError, kv instanceof TransferError, tx instanceof KvError, tx instanceof TransferError]).toEqual([true, false, false, true]);
  expect([plain instanceof KvError, plain instanceof TransferError, plain instanceof RpcError]).toEqual([false, false, false]);
  expect(new Error("x") instanceof ConnectError).toBe(false);
});

test("a handoff error carries its side as metadata", () => {
  const e = new HandoffError("decode", Code.DataLoss, "kv transfer failed");
  expect([e.side, e.code, e.rawMessage, e.metadata.get(FAILED_SIDE_HEADER)]).toEqual(["decode", Code.DataLoss, "kv transfer failed", "decode"]);
  expect(ConnectError.from(e)).toBe(e);
  expect([new ResumeError("unknown", "x").code, new ResumeError("mismatch", "y").code]).toEqual([Code.NotFound, Code.FailedPrecondition]);
});

test("the pure core names connects numbers", () => {
  // The codec never imports Connect; its two codes are Connect's.
  expect([grpcCodeOf("Format"), grpcCodeOf("Version"), grpcCodeOf("Shape")]).toEqual([Code.DataLoss, Code.FailedPrecondition, Code.FailedPrecondition]);
  expect(new EnvError("Format", 3, "crc").code).toBe(Code.DataLoss);
  expect([codeName(Code.DataLoss), codeName(Code.Canceled), codeName(99)]).toEqual(["DATA_LOSS", "CANCELLED", "CODE_99"]);
});

test("http status of every code is the gateways view", () => {
  const want: Record<string, number> = {
    Canceled: 502,
    Unknown: 502,
    InvalidArgument: 400,
    DeadlineExceeded: 504,
    NotFound: 502,
    AlreadyExists: 502,
    PermissionDenied: 502,
    ResourceExhausted: 429,
    FailedPrecondition: 503,
    Aborted: 502,
    OutOfRange: 502,
    Unimplemented: 502,
    Internal: 502,
    Unavailable: 503,
    DataLoss: 502,
    Unauthenticated: 502,
  };
  const got: Record<string, number> = {};
  for (const name of Object.keys(want)) got[name] = httpStatusOf(Code[name as keyof typeof Code]);
  expect(got).toEqual(want);
});

test("a prefill failure names no internal address", () => {
  const own = prefillFailure(new ConnectError("max_tokens 0 must be ≥ 1", Code.InvalidArgument), "r1");
  expect([own.status, own.message]).toEqual([400, "request r1: max_tokens 0 must be ≥ 1"]);
  // D refused P's push: the cluster's fault, and its words name D's address.
  const push = new HandoffError("decode", Code.InvalidArgument, "kv transfer to 10.0.0.5:50051 failed: owner of 300 characters, max 128");
  const fromD = prefillFailure(ConnectError.from(push), "r2");
  expect([fromD.status, fromD.message]).toEqual([502, "request r2: prefill failed (INVALID_ARGUMENT)"]);
  const lost = prefillFailure(new HandoffError("decode", Code.NotFound, "kv transfer to 10.0.0.5:50051 failed: block gone"), "r3");
  expect([lost.status, lost.message]).toEqual([502, "request r3: prefill failed (NOT_FOUND)"]);
  const busy = prefillFailure(new HandoffError("decode", Code.ResourceExhausted, "kv transfer to 10.0.0.5:50051 failed: no free block"), "r4");
  expect([busy.status, busy.message]).toEqual([429, "request r4: prefill failed (RESOURCE_EXHAUSTED)"]);
});
