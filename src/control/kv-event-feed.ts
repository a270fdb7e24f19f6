import { create } from "@bufbuild/protobuf";
import { type HeartbeatAck, type KvEvent, KvEventSchema, type KvEvents, KvEventsSchema } from "../gen/tl/control/v1/control_pb.ts";
import type { KvEventLog, KvEventSlice } from "../pool/index.ts";

/** Most hashes one beat carries (32 KiB of fixed64): the bound a gateway checks, docs/grpc-services.md. */
export const MAX_EVENT_HASHES_PER_BEAT = 4096;

/** What a feed reads: the engine's event log, and the hashes its pool names now (a snapshot). */
export interface KvEventSource {
  log: KvEventLog;
  named(): bigint[];
}

interface Snapshot {
  at: bigint;
  hashes: bigint[];
  index: number;
  offset: number;
}

/**
 * One gateway's cursor into an engine's KV events: what the next beat to that gateway
 * carries, and what its ack says it applied. Every gateway has its own (each replica
 * keeps its own index). A new feed starts with a snapshot; so does one whose gateway
 * asks for it (it saw a gap) or whose cursor fell out of the log. A batch is resent
 * until acked, so a lost beat loses no event.
 */
export class KvEventFeed {
  private want = 0n;
  private snap: Snapshot | null = null;
  private needSnapshot = true;
  /** What the last batch() sent: a snapshot piece ends at `sentTo`, events before `sentTo`. */
  private sentTo = 0;

  constructor(
    private readonly source: KvEventSource,
    private readonly maxHashes = MAX_EVENT_HASHES_PER_BEAT,
  ) {}

  /** The next beat's events. */
  batch(): KvEvents {
    const { log } = this.source;
    if (this.needSnapshot || (this.snap === null && this.want < log.oldestSeq)) {
      this.needSnapshot = false;
      this.snap = { at: log.nextSeq, hashes: this.source.named(), index: 0, offset: 0 };
    }
    const s = this.snap;
    if (s !== null) {
      this.sentTo = Math.min(s.offset + this.maxHashes, s.hashes.length);
      return create(KvEventsSchema, {
        firstSeq: s.at,
        epoch: log.epoch,
        snapshot: true,
        snapshotIndex: s.index,
        snapshotLast: this.sentTo === s.hashes.length,
        events: [create(KvEventSchema, { removed: false, hashes: s.hashes.slice(s.offset, this.sentTo) })],
      });
    }
    const slice = log.read(this.want, this.maxHashes);
    if (slice === null) {
      // Fell out of the log between the check above and now cannot happen (one thread); be safe.
      this.needSnapshot = true;
      return this.batch();
    }
    return create(KvEventsSchema, {
      firstSeq: slice.firstSeq,
      epoch: log.epoch,
      events: grouped(slice),
      more: slice.firstSeq + BigInt(slice.hashes.length) < log.nextSeq,
    });
  }

  /** Folds the gateway's answer to the batch just sent into the cursor. */
  acked(ack: HeartbeatAck): void {
    if (ack.kvSnapshot) {
      this.snap = null;
      this.needSnapshot = true;
      return;
    }
    const s = this.snap;
    if (s !== null) {
      s.offset = this.sentTo;
      s.index++;
      if (s.offset >= s.hashes.length) {
        this.snap = null;
        this.want = s.at;
      }
      return;
    }
    this.want = ack.kvNextSeq;
  }
}

/** Consecutive events of one kind travel as one KvEvent. */
function grouped(slice: KvEventSlice): KvEvent[] {
  const out: KvEvent[] = [];
  let i = 0;
  while (i < slice.hashes.length) {
    const kind = slice.removed[i]!;
    let j = i + 1;
    while (j < slice.hashes.length && slice.removed[j] === kind) j++;
    out.push(create(KvEventSchema, { removed: kind === 1, hashes: Array.from(slice.hashes.subarray(i, j)) }));
    i = j;
  }
  return out;
}
