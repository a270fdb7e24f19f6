import { Code, ConnectError } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { HeartbeatAckSchema, type HeartbeatAck, type WorkerStatus } from "../../src/gen/tl/control/v1/control_pb.ts";
import type { Registry } from "../../src/control/index.ts";

export type FakeMode = "ok" | "fail" | "hang";

/** A scriptable in-process Registry that records every beat it is sent. */
export class FakeRegistry implements Registry {
  readonly beats: { status: WorkerStatus; atMs: number }[] = [];
  readonly signals: AbortSignal[] = [];
  mode: FakeMode = "ok";
  /** Acks handed out in order; once used up, `fallback` is returned. */
  acks: { drain?: boolean; intervalMs?: number; gatewayId?: string }[] = [];
  fallback: { drain?: boolean; intervalMs?: number; gatewayId?: string } = {};

  heartbeat(status: WorkerStatus, _timeoutMs: number, signal?: AbortSignal): Promise<HeartbeatAck> {
    this.beats.push({ status, atMs: performance.now() });
    if (signal !== undefined) this.signals.push(signal);
    // As a registry whose port nothing listens on answers.
    if (this.mode === "fail") return Promise.reject(new ConnectError("registry down", Code.Unavailable));
    if (this.mode === "hang") return new Promise(() => {});
    return Promise.resolve(create(HeartbeatAckSchema, this.acks.shift() ?? this.fallback));
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls `cond` every 10 ms until it holds or `withinMs` passes; returns whether it held. */
export async function eventually(cond: () => boolean | Promise<boolean>, withinMs = 20_000): Promise<boolean> {
  const end = performance.now() + withinMs;
  while (performance.now() < end) {
    if (await cond()) return true;
    await sleep(10);
  }
  return cond();
}

/** The Connect code a call failed with, or undefined when it succeeded. */
export async function codeOf(p: Promise<unknown>): Promise<Code | undefined> {
  try {
    await p;
    return undefined;
  } catch (err) {
    return ConnectError.from(err).code;
  }
}
