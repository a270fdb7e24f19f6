import assert from "node:assert";
import type { KernelExports } from "./matmul.ts";

/**
 * Helper threads that take shares of one matmul's output rows over the kernel's shared memory.
 *
 * Invariant: a call is whole when `run` returns. The caller computes its own share meanwhile,
 * each helper computes the rows it is handed whole (every dot product in the kernel's one
 * order), so outputs are the same bits whatever the thread count. Helpers spin briefly on their
 * slot's generation counter, then sleep on it (Atomics.wait), and count themselves done on DONE.
 * A helper is handed rows only once it has set its READY flag: a worker may need the caller's
 * event loop to start, so a caller that blocked on one not yet running would wait forever.
 */
const SLOT = 12; // gen, fn, y, x, w, rows, n, d, i0, i1, ready (+ padding)
const READY = 10;
const DONE = 0;
const FNS = ["matmul_f32", "matmul_f16", "matmul_bf16", "matmul_q8_0"] as const;
export type KernelName = (typeof FNS)[number];

// The helper's whole program. It is a string run from a Blob URL rather than a module file so a
// binary made by `bun build --compile` carries it without a second entry point. It instantiates
// the kernel module on the shared memory, then computes whatever rows its slot is handed.
const HELPER_SOURCE = `
const FNS = ${JSON.stringify(FNS)};
self.onmessage = (e) => {
  const { module, memory, ctrl: buf, slot } = e.data;
  const ex = new WebAssembly.Instance(module, { env: { memory } }).exports;
  const ctrl = new Int32Array(buf);
  let seen = Atomics.load(ctrl, slot);
  Atomics.store(ctrl, slot + ${READY}, 1);
  postMessage("ready");
  for (;;) {
    // Spin a little first: one decode step hands out dozens of small matmuls back to back.
    for (let spins = 0; Atomics.load(ctrl, slot) === seen; spins++) {
      if (spins > 20000) Atomics.wait(ctrl, slot, seen, 100);
    }
    seen = Atomics.load(ctrl, slot);
    const c = slot;
    ex[FNS[ctrl[c + 1]]](ctrl[c + 2], ctrl[c + 3], ctrl[c + 4], ctrl[c + 5], ctrl[c + 6], ctrl[c + 7], ctrl[c + 8], ctrl[c + 9]);
    Atomics.add(ctrl, ${DONE}, 1);
    Atomics.notify(ctrl, ${DONE});
  }
};
`;
let helperUrl: string | null = null;

export class KernelThreads {
  readonly helpers: number;
  private readonly ctrl: Int32Array;
  private readonly workers: Worker[] = [];
  private gen = 0;
  /** Calls that were shared with at least one helper. */
  splitCalls = 0;
  /** Settles when every helper runs. */
  readonly ready: Promise<void>;

  constructor(module: WebAssembly.Module, memory: WebAssembly.Memory, helpers: number) {
    assert(Number.isInteger(helpers) && helpers >= 1, `helpers ${helpers}`);
    this.helpers = helpers;
    this.ctrl = new Int32Array(new SharedArrayBuffer((1 + helpers) * SLOT * 4));
    const started: Promise<void>[] = [];
    for (let h = 0; h < helpers; h++) {
      helperUrl ??= URL.createObjectURL(new Blob([HELPER_SOURCE], { type: "application/javascript" }));
      const w = new Worker(helperUrl);
      started.push(
        new Promise<void>((resolve, reject) => {
          w.addEventListener("message", () => resolve(), { once: true });
          w.addEventListener("error", (e) => reject(new Error(`kernel helper thread failed: ${e.message}`)), { once: true });
        }),
      );
      w.postMessage({ module, memory, ctrl: this.ctrl.buffer, slot: (1 + h) * SLOT });
      // Helpers never keep the process alive: an engine that stops exits.
      w.unref();
      this.workers.push(w);
    }
    this.ready = Promise.all(started).then(() => {});
    // A helper that failed to start is never READY, so it is never handed rows.
    this.ready.catch(() => {});
  }

  /**
   * y = x W^T over rows i0..i1 of d, split into `parts` aligned ranges: the helpers take the
   * first parts - 1, the caller the last. Blocks (spinning, then sleeping) until all are done.
   */
  run(ex: KernelExports, fn: KernelName, y: number, x: number, w: number, rows: number, n: number, d: number, parts: number): void {
    const ctrl = this.ctrl;
    const per = Math.ceil(d / parts / 8) * 8;
    Atomics.store(ctrl, DONE, 0);
    let handed = 0;
    let i0 = 0;
    this.gen++;
    for (let h = 0; h < this.helpers && handed < parts - 1 && i0 + per < d; h++) {
      const s = (1 + h) * SLOT;
      if (Atomics.load(ctrl, s + READY) === 0) continue;
      ctrl[s + 1] = FNS.indexOf(fn);
      ctrl[s + 2] = y;
      ctrl[s + 3] = x;
      ctrl[s + 4] = w;
      ctrl[s + 5] = rows;
      ctrl[s + 6] = n;
      ctrl[s + 7] = d;
      ctrl[s + 8] = i0;
      ctrl[s + 9] = i0 + per;
      Atomics.store(ctrl, s, this.gen);
      Atomics.notify(ctrl, s);
      handed++;
      i0 += per;
    }
    if (handed > 0) this.splitCalls++;
    ex[fn](y, x, w, rows, n, d, i0, d);
    for (let spins = 0; ; spins++) {
      const done = Atomics.load(ctrl, DONE);
      if (done === handed) break;
      if (spins > 20000) Atomics.wait(ctrl, DONE, done, 50);
    }
  }

  /** Stops the helpers; the kernel then runs on the caller alone. */
  close(): void {
    for (const w of this.workers) w.terminate();
    this.workers.length = 0;
  }
}
