import { Role, type WorkerStatus } from "../gen/tl/control/v1/control_pb.ts";

export interface WorkerRegistryOptions {
  /** The beat interval engines are told to keep (HeartbeatAck.interval_ms): heartbeat_interval_ms. */
  intervalMs: number;
  /** A worker silent for this many whole intervals is gone. */
  evictAfterMissed?: number;
  /** Unix milliseconds; injectable so tests can move time. */
  now?: () => number;
}

export interface WorkerView {
  /** The last beat, as sent. */
  status: WorkerStatus;
  lastSeenUnixMs: number;
  /** Whole intervals since the last beat. */
  missed: number;
  /** The gateway asked this worker to drain (it may not have said so yet). */
  drainRequested: boolean;
}

interface Entry {
  status: WorkerStatus;
  lastSeenUnixMs: number;
  drainRequested: boolean;
}

/**
 * The gateway's view of its engines, fed by heartbeats. Expiry is computed from
 * the clock on every read, so what list() and live() return never depends on
 * when sweep() last ran; sweep() only forgets the dead.
 */
export class WorkerRegistry {
  readonly intervalMs: number;
  readonly evictAfterMissed: number;
  private readonly now: () => number;
  private readonly workers = new Map<string, Entry>();

  constructor(opts: WorkerRegistryOptions) {
    this.intervalMs = opts.intervalMs;
    this.evictAfterMissed = opts.evictAfterMissed ?? 3;
    this.now = opts.now ?? Date.now;
    if (!(this.intervalMs > 0) || !(this.evictAfterMissed >= 1)) {
      throw new RangeError(`worker registry: intervalMs ${this.intervalMs} must be > 0 and evictAfterMissed ${this.evictAfterMissed} ≥ 1`);
    }
  }

  /** Records a beat; an evicted (or never seen) worker is admitted afresh. */
  beat(status: WorkerStatus): { drain: boolean; intervalMs: number } {
    const now = this.now();
    let entry = this.workers.get(status.workerId);
    if (entry !== undefined && this.expired(entry, now)) {
      // Not yet swept but already gone: whatever was asked of the old incarnation lapses.
      entry = undefined;
    }
    const drainRequested = entry?.drainRequested ?? false;
    this.workers.set(status.workerId, { status, lastSeenUnixMs: now, drainRequested });
    return { drain: drainRequested, intervalMs: this.intervalMs };
  }

  /** Live workers (evicted ones excluded), ordered by worker id. */
  list(): WorkerView[] {
    const now = this.now();
    const out: WorkerView[] = [];
    for (const entry of this.workers.values()) {
      if (this.expired(entry, now)) continue;
      out.push({
        status: entry.status,
        lastSeenUnixMs: entry.lastSeenUnixMs,
        missed: this.missed(entry, now),
        drainRequested: entry.drainRequested,
      });
    }
    return out.sort((a, b) => (a.status.workerId < b.status.workerId ? -1 : 1));
  }

  /** Forgets workers silent for evictAfterMissed intervals; returns their ids. */
  sweep(): string[] {
    const now = this.now();
    const evicted: string[] = [];
    for (const [id, entry] of this.workers) {
      if (this.expired(entry, now)) {
        this.workers.delete(id);
        evicted.push(id);
      }
    }
    return evicted;
  }

  /** Asks a worker to drain on its next beat; false for an unknown or evicted worker. */
  requestDrain(workerId: string): boolean {
    const entry = this.workers.get(workerId);
    if (entry === undefined || this.expired(entry, this.now())) return false;
    entry.drainRequested = true;
    return true;
  }

  /**
   * Workers that may take new work: not evicted, not draining, not asked to
   * drain; with `role`, only those that can play it ("both" plays either).
   */
  live(role?: "prefill" | "decode"): WorkerView[] {
    return this.list().filter((w) => !w.status.draining && !w.drainRequested && (role === undefined || plays(w.status.role, role)));
  }

  private missed(entry: Entry, now: number): number {
    return Math.max(0, Math.floor((now - entry.lastSeenUnixMs) / this.intervalMs));
  }

  private expired(entry: Entry, now: number): boolean {
    return this.missed(entry, now) >= this.evictAfterMissed;
  }
}

function plays(role: Role, wanted: "prefill" | "decode"): boolean {
  if (role === Role.BOTH) return true;
  return wanted === "prefill" ? role === Role.PREFILL : role === Role.DECODE;
}
