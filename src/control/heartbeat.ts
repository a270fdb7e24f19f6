import { Code, ConnectError } from "@connectrpc/connect";
import type { HeartbeatAck, WorkerStatus } from "../gen/tl/control/v1/control_pb.ts";
import type { KvEventFeed } from "./kv-event-feed.ts";
import { workerStatus, type WorkerIdentity, type WorkerLoad } from "./worker-status.ts";

/** The gateway's WorkerRegistry as an engine sees it. */
export interface Registry {
  /** Implementations should give up when `signal` aborts; beatOnce bounds the call regardless. */
  heartbeat(status: WorkerStatus, timeoutMs: number, signal?: AbortSignal): Promise<HeartbeatAck>;
}

export interface BeatState {
  /** Consecutive failed beats; a success resets it. */
  failures: number;
  /**
   * Consecutive beats the registry's address refused outright (UNAVAILABLE: nothing listens,
   * the connection was reset), as opposed to timing out: an overloaded or frozen gateway
   * still accepts connections, a dead one does not. Any other outcome resets it.
   */
  unreachable: number;
  /** Seq of the last beat sent (0 before the first). */
  seq: bigint;
  /** Set by the first ack that asks for a drain and never cleared: the engine remembers it. */
  drainRequested: boolean;
  intervalMs: number;
  /** The gateway replica the last ack came from (HeartbeatAck.gateway_id; "" before one, or once it is gone). */
  gatewayId: string;
}

export function newBeatState(intervalMs: number): BeatState {
  return { failures: 0, unreachable: 0, seq: 0n, drainRequested: false, intervalMs, gatewayId: "" };
}

/** What a beat loop does beyond saying how the engine is: its KV events, and who to tell a gateway is gone. */
export interface HeartbeatExtras {
  /** This gateway's cursor into the engine's KV events; none: the beats carry no events. */
  events?: KvEventFeed;
  /**
   * The gateway replica `gatewayId` is gone: `goneAfterFailures` beats in a row found nothing
   * at its address (refused, not merely late: a slow replica keeps its handles), or another
   * replica now answers there, or the loop stopped for good (its address left the list).
   * The engine frees the handles that replica asked for and never claimed.
   */
  onGatewayGone?: (gatewayId: string) => void;
  /** Refused beats in a row after which the gateway counts as gone (default 3, the registry's own eviction). */
  goneAfterFailures?: number;
}

/**
 * Sends one beat and folds the outcome into `state`. Resolves within `timeoutMs`
 * even when the registry never answers: the call is raced against a timer and
 * aborted through its signal. Aborting `signal` (a stopping loop) ends it at
 * once without counting a failure.
 */
export async function beatOnce(
  registry: Registry,
  status: WorkerStatus,
  timeoutMs: number,
  state: BeatState,
  signal?: AbortSignal,
  onAck?: (ack: HeartbeatAck) => void,
): Promise<boolean> {
  if (signal?.aborted) return false;
  const call = new AbortController();
  const onStop = () => call.abort(signal?.reason);
  signal?.addEventListener("abort", onStop, { once: true });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const cut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => call.abort(new Error(`heartbeat timed out after ${timeoutMs} ms`)), timeoutMs);
    call.signal.addEventListener("abort", () => reject(call.signal.reason), { once: true });
  });
  try {
    const ack = await Promise.race([registry.heartbeat(status, timeoutMs, call.signal), cut]);
    state.failures = 0;
    state.unreachable = 0;
    if (ack.drain) state.drainRequested = true;
    if (ack.intervalMs > 0) state.intervalMs = ack.intervalMs;
    onAck?.(ack);
    return true;
  } catch (e) {
    if (!signal?.aborted) {
      state.failures++;
      state.unreachable = e instanceof ConnectError && e.code === Code.Unavailable ? state.unreachable + 1 : 0;
    }
    return false;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onStop);
    // Settles `cut` (already raced, so its rejection is handled) and cancels a call the timer did not.
    call.abort(new Error("beat finished"));
  }
}

/** An engine's beat loop: one beat at once, then one per interval, until stop(). */
export class Heartbeat {
  readonly state: BeatState;
  private readonly stopper = new AbortController();
  private drainNotified = false;
  private loop: Promise<void> = Promise.resolve();

  private constructor(
    private readonly registry: Registry,
    private readonly identity: WorkerIdentity,
    private readonly loadFn: () => WorkerLoad,
    intervalMs: number,
    private readonly timeoutMs: number,
    private readonly onDrain?: () => void,
    private readonly extras: HeartbeatExtras = {},
  ) {
    this.state = newBeatState(intervalMs);
  }

  static spawn(
    registry: Registry,
    identity: WorkerIdentity,
    loadFn: () => WorkerLoad,
    intervalMs: number,
    timeoutMs: number,
    onDrain?: () => void,
    extras?: HeartbeatExtras,
  ): Heartbeat {
    const hb = new Heartbeat(registry, identity, loadFn, intervalMs, timeoutMs, onDrain, extras);
    hb.loop = hb.run();
    return hb;
  }

  private wake: (() => void) | null = null;
  private eventsOff = false;

  /** Cuts the current wait short, so the next beat (e.g. one saying "draining") goes out now. */
  beatNow(): void {
    this.wake?.();
  }

  /** Ends the loop, aborting a beat in flight; resolves once the loop has exited. */
  async stop(): Promise<void> {
    this.stopper.abort(new Error("heartbeat stopped"));
    await this.loop;
  }

  /** Ends the loop for good because its gateway left the list: that replica counts as gone. */
  async retire(): Promise<void> {
    await this.stop();
    this.gone();
  }

  private gone(): void {
    const id = this.state.gatewayId;
    if (id === "") return;
    this.state.gatewayId = "";
    try {
      this.extras.onGatewayGone?.(id);
    } catch (err) {
      console.error("heartbeat: onGatewayGone threw:", err);
    }
  }

  private acked(ack: HeartbeatAck): void {
    // A gateway that names no replica id predates KV events: it would be sent a snapshot on
    // every beat (it never acknowledges a seq), so it is sent none.
    if (ack.gatewayId === "") this.eventsOff = true;
    if (ack.gatewayId !== this.state.gatewayId) {
      // Another replica answers at this address (a restart): the one before it is gone.
      this.gone();
      this.state.gatewayId = ack.gatewayId;
    }
    this.extras.events?.acked(ack);
  }

  private async run(): Promise<void> {
    const signal = this.stopper.signal;
    while (!signal.aborted) {
      const started = performance.now();
      await this.beat(signal);
      if (this.state.drainRequested && !this.drainNotified) {
        this.drainNotified = true;
        try {
          this.onDrain?.();
        } catch (err) {
          // The engine's drain hook failing must not silence its heartbeat.
          console.error("heartbeat: onDrain threw:", err);
        }
      }
      // Fixed rate: a slow beat eats into the wait instead of stretching the period.
      await sleep(this.state.intervalMs - (performance.now() - started), signal, (w) => (this.wake = w));
      this.wake = null;
    }
  }

  private async beat(signal: AbortSignal): Promise<void> {
    this.state.seq += 1n;
    let status: WorkerStatus;
    try {
      const load = this.loadFn();
      status = workerStatus(
        this.identity,
        // Once told to drain the engine says so on every beat, whatever its load hook reports.
        { ...load, draining: load.draining || this.state.drainRequested },
        this.state.seq,
      );
      if (this.extras.events && !this.eventsOff) status.kvEvents = this.extras.events.batch();
    } catch {
      this.state.failures++;
      return;
    }
    await beatOnce(this.registry, status, this.timeoutMs, this.state, signal, (ack) => this.acked(ack));
    if (this.state.unreachable >= (this.extras.goneAfterFailures ?? 3)) this.gone();
  }
}

function sleep(ms: number, signal: AbortSignal, onWake: (wake: () => void) => void): Promise<void> {
  if (ms <= 0 || signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    // The beat loop alone must not keep a process alive.
    const timer = setTimeout(done, ms);
    timer.unref?.();
    signal.addEventListener("abort", done, { once: true });
    onWake(done);
  });
}
