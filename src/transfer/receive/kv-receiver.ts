import assert from "node:assert";
import {
  chunkRecordHash,
  crc32c,
  crc32cExtendU32,
  ENVELOPE_HEAD_BYTES,
  EnvelopeCrc,
  envelopeHeadCrc,
  EnvError,
  type EnvelopeRecord,
  hex32,
  hex64,
  joinEnvelope,
  KV_FORMAT,
  oneBlockRecord,
  oneBlockRecordParts,
  readEnvelope,
} from "../../codec/index.ts";
import type { KvPool } from "../../pool/index.ts";
import { type KvAckLike, type KvChunkLike, KvError } from "../wire/index.ts";
import { Code } from "../../rpc/status.ts";

export interface KvReceiverOptions {
  /** A handle (or a push in flight) not claimed or released within this is freed (handle_ttl_s). */
  ttlMs: number;
  /** Cap on accepted-but-unclaimed handles plus pushes in flight; default 1024. */
  maxPending?: number;
  /** Cap on pushes in flight at once; default 64. */
  maxInFlight?: number;
  /**
   * Caps per identified peer (a prefill engine's certificate), so one cannot take
   * another's share: pushes in flight (default half of maxInFlight), handles pending
   * plus pushes in flight (half of maxPending), and blocks held by both (half the pool).
   * Pushes from the anonymous peer "" (plaintext) answer only to the global caps.
   */
  maxInFlightPerPeer?: number;
  maxPendingPerPeer?: number;
  maxBlocksPerPeer?: number;
  /** A push that receives nothing for this long is aborted and freed (push_idle_timeout_ms). */
  pushIdleTimeoutMs: number;
  /** Clock, replaceable in tests; default Date.now. */
  now?: () => number;
  /** Called for each accepted handle its time to live freed (metrics: tl_kv_handles_expired_total). */
  onExpired?: (handleId: string) => void;
}

/** The blocks a resumed request takes over from a handle. */
export interface ClaimedHandle {
  /** block ids in prompt order: the full blocks, then the tail if any */
  blockIds: number[];
  /** the chained hashes of the full blocks, in order */
  hashes: bigint[];
  /** full blocks × B + the tail's fill */
  nTokens: number;
}

/** A chunk's fields but its envelope, which acceptParts receives in parts. */
type ChunkFields = Omit<KvChunkLike, "envelope">;

interface Held extends ClaimedHandle {
  expiresAt: number;
  /** the peer that pushed it ("" when unidentified) */
  peer: string;
  /** the gateway replica the push was asked for ("" when none said): releaseOwner frees it early */
  owner: string;
}

/** Longest owner (a gateway replica's worker id, peer-identity.ts) a push may name. */
export const MAX_OWNER_CHARS = 128;

/** What one identified peer holds on this receiver right now. */
interface PeerShare {
  inFlight: number;
  pending: number;
  blocks: number;
}

/**
 * The decode side of tl.kv.v1 over a shared KvPool, without any transport: KvService
 * (gRPC) and the data plane server drive it alike, so both paths refuse and free the
 * same way.
 *
 * Accepted pushes are held under their handle id until `claim` hands the references to
 * a resumed request, `release` drops them, or the time to live ends, so a gateway that
 * dies after Prefill cannot pin D's pool.
 */
export class KvReceiver {
  readonly pool: KvPool;
  readonly ttlMs: number;
  readonly maxPending: number;
  readonly maxInFlight: number;
  readonly maxInFlightPerPeer: number;
  readonly maxPendingPerPeer: number;
  readonly maxBlocksPerPeer: number;
  readonly pushIdleTimeoutMs: number;
  private readonly now: () => number;
  private readonly onExpired: (handleId: string) => void;
  private readonly held = new Map<string, Held>();
  private readonly shares = new Map<string, PeerShare>();
  /** @internal sessions register themselves here while open */
  readonly inflight = new Map<string, PushSession>();
  private readonly timer: ReturnType<typeof setInterval>;
  private nextSweep = 0;
  /** @internal scratch of PushSession.accept (pushes interleave only between chunks) */
  readonly crc = new EnvelopeCrc();

  constructor(pool: KvPool, opts: KvReceiverOptions) {
    this.pool = pool;
    this.ttlMs = opts.ttlMs;
    this.maxPending = opts.maxPending ?? 1024;
    this.maxInFlight = opts.maxInFlight ?? 64;
    this.maxInFlightPerPeer = opts.maxInFlightPerPeer ?? Math.max(1, this.maxInFlight >> 1);
    this.maxPendingPerPeer = opts.maxPendingPerPeer ?? Math.max(1, this.maxPending >> 1);
    this.maxBlocksPerPeer = opts.maxBlocksPerPeer ?? Math.max(1, pool.total >> 1);
    this.pushIdleTimeoutMs = opts.pushIdleTimeoutMs;
    this.now = opts.now ?? Date.now;
    this.onExpired = opts.onExpired ?? (() => {});
    assert(this.ttlMs > 0 && this.maxPending >= 1 && this.maxInFlight >= 1, "ttlMs, maxPending and maxInFlight must be positive");
    assert(this.pushIdleTimeoutMs > 0, "pushIdleTimeoutMs must be positive");
    // The timer frees handles nobody asks about and pushes gone quiet; the lazy sweeps in
    // the accessors make expiry exact whenever someone does.
    this.timer = setInterval(() => this.sweep(), Math.max(10, Math.min(this.ttlMs, this.pushIdleTimeoutMs, 5_000)));
    this.timer.unref?.();
  }

  /** Which hashes D holds (used or cached). Takes no reference and leaves the LRU alone. */
  hasBlocks(hashes: readonly bigint[], kvFormat: number): boolean[] {
    checkFormat(kvFormat);
    const out = new Array<boolean>(hashes.length);
    for (let i = 0; i < hashes.length; i++) out[i] = hashes[i] !== 0n && this.pool.lookup(hashes[i]!) >= 0;
    return out;
  }

  /**
   * Opens a push (on its first chunk) for `peer` (the pushing engine's worker id, "" when
   * unidentified). Refuses a handle id pending or in flight, or one push too many, for
   * this receiver or for this peer.
   */
  begin(handleId: string, total: number, peer = "", owner = ""): PushSession {
    this.sweep();
    if (handleId === "") throw new KvError(Code.InvalidArgument, "empty handle_id");
    if (owner.length > MAX_OWNER_CHARS) throw new KvError(Code.InvalidArgument, `owner of ${owner.length} characters, max ${MAX_OWNER_CHARS}`);
    if (!(Number.isInteger(total) && total >= 1)) throw new KvError(Code.InvalidArgument, `total ${total} must be ≥ 1`);
    if (this.held.has(handleId) || this.inflight.has(handleId)) {
      throw new KvError(Code.AlreadyExists, `handle ${handleId} is already ${this.held.has(handleId) ? "pending" : "being pushed"}`);
    }
    if (this.inflight.size >= this.maxInFlight) {
      throw new KvError(Code.ResourceExhausted, `${this.inflight.size} pushes in flight, max ${this.maxInFlight}`);
    }
    if (this.held.size + this.inflight.size >= this.maxPending) {
      throw new KvError(Code.ResourceExhausted, `${this.held.size} handles pending + ${this.inflight.size} in flight, max ${this.maxPending}`);
    }
    const share = peer === "" ? undefined : this.shareOf(peer);
    if (share !== undefined) {
      if (share.inFlight >= this.maxInFlightPerPeer)
        throw new KvError(Code.ResourceExhausted, `peer ${peer}: ${share.inFlight} pushes in flight, max ${this.maxInFlightPerPeer}`);
      if (share.pending + share.inFlight >= this.maxPendingPerPeer) {
        throw new KvError(
          Code.ResourceExhausted,
          `peer ${peer}: ${share.pending} handles pending + ${share.inFlight} in flight, max ${this.maxPendingPerPeer}`,
        );
      }
      share.inFlight++;
    }
    const s = new PushSession(this, handleId, total, this.now() + this.ttlMs, peer, this.now(), owner);
    this.inflight.set(handleId, s);
    this.nextSweep = Math.min(this.nextSweep, s.deadline, s.lastActive + this.pushIdleTimeoutMs);
    return s;
  }

  /**
   * Hands the handle's references to the caller (who must release them), or null if
   * unknown or expired. With `fits`, only a handle it finds no fault with is handed
   * over; one it faults (a resume naming the wrong prompt) stays pending for the right
   * claim, and the fault comes back instead.
   */
  claim(handleId: string): ClaimedHandle | null;
  claim(handleId: string, fits: (h: ClaimedHandle) => string | null): ClaimedHandle | { fault: string } | null;
  claim(handleId: string, fits?: (h: ClaimedHandle) => string | null): ClaimedHandle | { fault: string } | null {
    this.sweep();
    const h = this.held.get(handleId);
    if (h === undefined) return null;
    const handed = { blockIds: h.blockIds, hashes: h.hashes, nTokens: h.nTokens };
    const fault = fits?.(handed) ?? null;
    if (fault !== null) return { fault };
    this.drop(handleId, h);
    return handed;
  }

  /**
   * Frees a pending handle. Idempotent: false when unknown (never claimed, released or
   * expired). With `by` (a peer's worker id), only that peer's own handles: another's
   * answers false, exactly as an unknown one, so handle ids cannot be probed.
   */
  release(handleId: string, by?: string): boolean {
    const h = this.held.get(handleId);
    if (h === undefined || (by !== undefined && h.peer !== by)) return false;
    this.drop(handleId, h);
    this.pool.releaseAll(h.blockIds);
    return true;
  }

  /**
   * Frees every pending handle the gateway replica `owner` asked for: it is gone (its
   * beats failed, or another replica answers at its address), so no client of it will
   * claim them. Handles of other replicas, and of none (""), are left alone. Returns how
   * many were freed.
   */
  releaseOwner(owner: string): number {
    if (owner === "") return 0;
    let n = 0;
    for (const [id, h] of [...this.held]) {
      if (h.owner !== owner) continue;
      this.drop(id, h);
      this.pool.releaseAll(h.blockIds);
      n++;
    }
    return n;
  }

  /** What `peer` holds now: pushes in flight, handles pending, blocks (both together). */
  shareOf(peer: string): PeerShare {
    let s = this.shares.get(peer);
    if (s === undefined) this.shares.set(peer, (s = { inFlight: 0, pending: 0, blocks: 0 }));
    return s;
  }

  /** Forgets a pending handle (its references go to the caller or back to the pool). */
  private drop(handleId: string, h: Held): void {
    this.held.delete(handleId);
    if (h.peer === "") return;
    const share = this.shareOf(h.peer);
    share.pending--;
    share.blocks -= h.blockIds.length;
    if (share.inFlight === 0 && share.pending === 0) this.shares.delete(h.peer);
  }

  /** Handles accepted and not yet claimed, released or expired. */
  pending(): number {
    this.sweep();
    return this.held.size;
  }

  /** Pushes open right now. */
  inFlight(): number {
    this.sweep();
    return this.inflight.size;
  }

  /** Frees expired handles and aborts pushes that outlived the time to live; returns how many. */
  sweep(): number {
    const t = this.now();
    if (t < this.nextSweep) return 0;
    let n = 0;
    let next = Infinity;
    for (const [id, h] of this.held) {
      if (h.expiresAt <= t) {
        this.drop(id, h);
        this.pool.releaseAll(h.blockIds);
        this.onExpired(id);
        n++;
      } else next = Math.min(next, h.expiresAt);
    }
    for (const s of [...this.inflight.values()]) {
      const quietUntil = s.lastActive + this.pushIdleTimeoutMs;
      if (s.deadline <= t || quietUntil <= t) {
        s.abort();
        n++;
      } else next = Math.min(next, s.deadline, quietUntil);
    }
    this.nextSweep = next;
    return n;
  }

  /** Stops the timer and frees every pending handle and open push. */
  close(): void {
    clearInterval(this.timer);
    for (const s of [...this.inflight.values()]) s.abort();
    for (const id of [...this.held.keys()]) this.release(id);
  }

  /** @internal `blocks` taken (or, negative, given back) by a push of `peer`; refuses past its share. */
  charge(peer: string, blocks: number): void {
    if (peer === "") return;
    const share = this.shareOf(peer);
    if (blocks > 0 && share.blocks + blocks > this.maxBlocksPerPeer) {
      throw new KvError(Code.ResourceExhausted, `peer ${peer}: holds ${share.blocks} blocks, max ${this.maxBlocksPerPeer}`);
    }
    share.blocks += blocks;
  }

  /** @internal */
  settle(s: PushSession, accepted: Held | null): void {
    if (this.inflight.get(s.handleId) === s) this.inflight.delete(s.handleId);
    if (s.peer !== "") {
      const share = this.shareOf(s.peer);
      share.inFlight--;
      if (accepted !== null) share.pending++;
      else if (share.pending === 0 && share.inFlight === 0 && share.blocks === 0) this.shares.delete(s.peer);
    }
    if (accepted !== null) {
      this.held.set(s.handleId, accepted);
      this.nextSweep = Math.min(this.nextSweep, accepted.expiresAt);
    }
  }

  /** @internal */
  expiry(): number {
    return this.now() + this.ttlMs;
  }

  /** @internal */
  clock(): number {
    return this.now();
  }
}

/**
 * One push being received. Every chunk is checked before anything is allocated; a
 * refused chunk leaves the session open so the caller decides (it always aborts).
 */
export class PushSession {
  private readonly taken: number[] = [];
  private readonly hashes: bigint[] = [];
  private next = 0;
  private nTokens = 0;
  private received = 0;
  private deduped = 0;
  private bytes = 0;
  private state: "open" | "done" | "aborted" = "open";

  constructor(
    private readonly rx: KvReceiver,
    readonly handleId: string,
    readonly total: number,
    /** @internal */ readonly deadline: number,
    /** the pushing peer ("" when unidentified) */
    readonly peer: string,
    /** @internal when the last chunk arrived (the idle timeout counts from it) */
    public lastActive: number,
    /** the gateway replica the push was asked for ("" when none said) */
    readonly owner = "",
  ) {}

  get aborted(): boolean {
    return this.state === "aborted";
  }

  /** Checks one chunk, then takes its block (a copy of the envelope, or a reference on D's cached copy). */
  accept(c: KvChunkLike): void {
    this.checkChunk(c);
    const crc = this.rx.crc;
    crc.compute(c.envelope);
    this.checkCrc(c, crc.whole);
    if (c.envelope.length === 0) {
      this.takeCached(c);
      return;
    }
    this.importRecord(c, oneBlockRecord(c.envelope, this.rx.pool.shape, crc.inner) ?? this.slowRecord(c, c.envelope), c.envelope.length);
  }

  /**
   * accept() for a chunk whose one-block envelope arrives in parts (the data plane's RUN
   * frame): `head[h, h + ENVELOPE_HEAD_BYTES)`, the payload, and the trailing CRC field.
   * The same checks in the same order, and the same answers, as for the joined envelope.
   */
  acceptParts(c: ChunkFields, head: Uint8Array, h: number, payload: Uint8Array, trailer: number): void {
    this.checkChunk(c);
    const inner = crc32c(payload, envelopeHeadCrc(head, h));
    this.checkCrc(c, crc32cExtendU32(inner, trailer));
    const rec = oneBlockRecordParts(head, h, payload, trailer, this.rx.pool.shape, inner);
    this.importRecord(c, rec ?? this.slowRecord(c, joinEnvelope(head, h, payload, trailer)), ENVELOPE_HEAD_BYTES + payload.length + 4);
  }

  private checkChunk(c: ChunkFields): void {
    if (this.state !== "open") {
      throw new KvError(Code.Aborted, `push ${this.handleId} is ${this.state === "done" ? "finished" : "aborted (expired)"}`);
    }
    if (c.handleId !== this.handleId) {
      throw new KvError(Code.InvalidArgument, `chunk ${c.index}: handle ${c.handleId}, push is ${this.handleId}`);
    }
    if (c.total !== this.total) throw new KvError(Code.InvalidArgument, `chunk ${c.index}: total ${c.total}, push has ${this.total}`);
    if (c.index !== this.next) throw new KvError(Code.InvalidArgument, `chunk index ${c.index}, want ${this.next}`);
    checkFormat(c.kvFormat);
    // Only the last block may be partial: a hashless block mid-push would shift every later token.
    if (c.hash === 0n && c.index !== this.total - 1) throw new KvError(Code.InvalidArgument, `chunk ${c.index} of ${this.total}: hash 0 before the last chunk`);
  }

  private checkCrc(c: ChunkFields, got: number): void {
    if (got !== c.crc32c >>> 0) throw new KvError(Code.DataLoss, `chunk ${c.index}: crc mismatch: got ${hex32(got)}, want ${hex32(c.crc32c)}`);
  }

  /** A present block (empty envelope): a reference on D's cached copy. */
  private takeCached(c: ChunkFields): void {
    if (c.hash === 0n) throw new KvError(Code.InvalidArgument, `chunk ${c.index}: empty envelope without a hash`);
    const pool = this.rx.pool;
    const id = pool.lookup(c.hash);
    if (id < 0) throw new KvError(Code.NotFound, `chunk ${c.index}: block ${hex64(c.hash)} no longer held`);
    pool.acquire(id);
    this.take(id, c.hash, pool.shape.blockTokens);
    this.deduped++;
  }

  /** The verdict of the full reader rules on an envelope the one-block fast path did not take. */
  private slowRecord(c: ChunkFields, envelope: Uint8Array): EnvelopeRecord {
    try {
      const env = readEnvelope(envelope, this.rx.pool.shape);
      if (env.records.length !== 1) {
        throw new KvError(Code.InvalidArgument, `chunk ${c.index}: envelope holds ${env.records.length} blocks, want 1`);
      }
      return env.records[0]!;
    } catch (e) {
      if (e instanceof EnvError) throw new KvError(e.code, `chunk ${c.index}: ${e.message}`);
      throw e;
    }
  }

  private importRecord(c: ChunkFields, rec: EnvelopeRecord, envelopeBytes: number): void {
    const pool = this.rx.pool;
    const B = pool.shape.blockTokens;
    const hash = chunkRecordHash(c.hash, rec, B);
    if (hash === null) {
      throw new KvError(Code.DataLoss, `chunk ${c.index}: record hash ${hex64(rec.hash)} (fill ${rec.nTokens}) disagrees with chunk hash ${hex64(c.hash)}`);
    }
    if (hash !== 0n && rec.nTokens !== B) {
      throw new KvError(Code.DataLoss, `chunk ${c.index}: hash ${hex64(hash)} on a partial block (fill ${rec.nTokens})`);
    }
    // One write of the block (no zeroing first); slots past a partial fill come out zero.
    const id = pool.importBlock(rec.payload, rec.nTokens);
    if (id < 0) throw new KvError(Code.ResourceExhausted, `chunk ${c.index}: no free block (${pool.used} of ${pool.total} in use)`);
    // Named only when the push is accepted (finish): a refused push must leave D's
    // cache as it was, so its copies go back free, not cached.
    this.take(id, hash, rec.nTokens);
    this.received++;
    this.bytes += envelopeBytes;
  }

  private take(id: number, hash: bigint, fill: number): void {
    try {
      this.rx.charge(this.peer, 1);
    } catch (e) {
      this.rx.pool.release(id);
      throw e;
    }
    this.lastActive = this.rx.clock();
    this.taken.push(id);
    if (hash !== 0n) this.hashes.push(hash);
    this.nTokens += fill;
    this.next++;
  }

  /** Ends a push that saw all `total` chunks; any other end is a refusal, thrown with every block already freed. */
  finish(): KvAckLike {
    if (this.state !== "open") {
      throw new KvError(Code.Aborted, `push ${this.handleId} is ${this.state === "done" ? "finished" : "aborted (expired)"}`);
    }
    if (this.next !== this.total) {
      this.abort();
      throw new KvError(Code.InvalidArgument, `push ${this.handleId} ended after ${this.next} of ${this.total} chunks`);
    }
    this.state = "done";
    // Full blocks are the leading ones. A hash another block owns meanwhile (a
    // concurrent push of the same prefix) leaves this copy unnamed: freed, not cached, later.
    const pool = this.rx.pool;
    for (let i = 0; i < this.hashes.length; i++) pool.register(this.taken[i]!, this.hashes[i]!);
    this.rx.settle(this, {
      blockIds: this.taken,
      hashes: this.hashes,
      nTokens: this.nTokens,
      expiresAt: this.rx.expiry(),
      peer: this.peer,
      owner: this.owner,
    });
    return {
      handleId: this.handleId,
      blocksReceived: this.received,
      blocksDeduped: this.deduped,
      payloadBytes: BigInt(this.bytes),
      nTokens: this.nTokens,
    };
  }

  /** Releases every block taken so far. Idempotent; a no-op after finish. */
  abort(): void {
    if (this.state !== "open") return;
    this.state = "aborted";
    this.rx.pool.releaseAll(this.taken);
    this.rx.charge(this.peer, -this.taken.length);
    this.taken.length = 0;
    this.rx.settle(this, null);
  }
}

function checkFormat(kvFormat: number): void {
  if (kvFormat !== KV_FORMAT) throw new KvError(Code.FailedPrecondition, `kv_format ${kvFormat} not spoken, this engine speaks ${KV_FORMAT}`);
}
