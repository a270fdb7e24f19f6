import { ConnectError } from "@connectrpc/connect";
import { type Attributes, type Context, endSpan, type Span, SpanKind, startSpan } from "../../obs/index.ts";
import { Code } from "../../rpc/status.ts";
import { ackSpanAttributes, type KvAckLike, type KvChunkLike, KvError } from "../wire/index.ts";
import type { KvReceiver, PushSession } from "./kv-receiver.ts";

/** The decode side's kv.transfer span of a gRPC PushKv, whichever handler serves it. */
export const GRPC_PUSH_ATTRS: Attributes = {
  "tl.role": "decode",
  "tl.kv.transport": "grpc",
  "rpc.system": "grpc",
  "rpc.service": "tl.kv.v1.KvTransfer",
  "rpc.method": "PushKv",
};
/** ... and of a push over the binary data plane. */
export const DATA_PLANE_PUSH_ATTRS: Attributes = { "tl.role": "decode", "tl.kv.transport": "data-plane" };

/** A chunk's fields but its envelope, which acceptParts receives in parts. */
type ChunkFields = Omit<KvChunkLike, "envelope">;

/** `e` as a refusal with its gRPC code: a KvError as it is, a Connect error with its code, anything else INTERNAL. */
export function toKvError(e: unknown): KvError {
  if (e instanceof KvError) return e;
  if (e instanceof ConnectError) return new KvError(e.code, e.rawMessage);
  return new KvError(Code.Internal, e instanceof Error ? e.message : String(e));
}

/**
 * One push on the decode side, whichever transport carries it (the Connect service, the
 * direct gRPC handler, the data plane): it opens the receiver's session on the first
 * chunk, feeds it, ends it with an ack or aborts it, and owns the push's kv.transfer
 * SERVER span. Invariant: after `finish` or `fail` nothing of the push stays taken and
 * its span has ended; a driver is then ready for the next push (the data plane reuses
 * one per connection). Every failure leaves as a KvError.
 */
export class PushDriver {
  private session: PushSession | undefined;
  private span: Span | undefined;
  /** The pushing peer's worker id (its mTLS certificate's); "" when unidentified. */
  peer = "";
  /** The gateway replica this push was asked for (an OWNER frame, or KvChunk.owner); "" none. */
  owner = "";

  constructor(private readonly rx: KvReceiver) {}

  /** Whether a push is open (a chunk arrived and it has not ended). */
  get open(): boolean {
    return this.session !== undefined;
  }

  /** Starts this push's span under `parent` (gRPC metadata or a TRACE frame); a span still open ends as abandoned. */
  trace(parent: Context | string, attrs: Attributes): void {
    this.endSpan("a new push began before this one ended");
    this.span = startSpan("kv.transfer", SpanKind.SERVER, parent, attrs);
  }

  /** Opens the push on its first chunk (later calls keep it): a RUN frame's head opens it before its payloads. */
  begin(handleId: string, total: number): PushSession {
    this.session ??= this.rx.begin(handleId, total, this.peer, this.owner);
    return this.session;
  }

  accept(c: KvChunkLike): void {
    if (this.session === undefined && c.owner) this.owner = c.owner;
    this.begin(c.handleId, c.total).accept(c);
  }

  /** accept() for an envelope in three parts (PushSession.acceptParts). */
  acceptParts(c: ChunkFields, head: Uint8Array, h: number, payload: Uint8Array, trailer: number): void {
    this.begin(c.handleId, c.total).acceptParts(c, head, h, payload, trailer);
  }

  /** Ends the push: its ack, or a refusal thrown with everything already freed. */
  finish(): KvAckLike {
    const s = this.session;
    if (s === undefined) throw this.fail(new KvError(Code.InvalidArgument, "empty push"));
    this.session = undefined;
    this.owner = "";
    let ack: KvAckLike;
    try {
      ack = s.finish();
    } catch (e) {
      throw this.fail(e);
    }
    if (this.span?.isRecording()) this.span.setAttributes(ackSpanAttributes(ack));
    this.endSpan();
    return ack;
  }

  /** Frees whatever the push took and ends its span with the error; returns the error as a KvError. */
  fail(e: unknown): KvError {
    this.session?.abort();
    this.session = undefined;
    this.owner = "";
    const err = toKvError(e);
    this.endSpan(err);
    return err;
  }

  private endSpan(error?: unknown): void {
    if (this.span === undefined) return;
    endSpan(this.span, error);
    this.span = undefined;
  }
}

/** A whole push at once (tests, tools): every chunk, then the end. On a refusal nothing stays taken. */
export function acceptAll(rx: KvReceiver, chunks: Iterable<KvChunkLike>): KvAckLike {
  const push = new PushDriver(rx);
  try {
    for (const c of chunks) push.accept(c);
    return push.finish();
  } catch (e) {
    throw push.fail(e);
  }
}
