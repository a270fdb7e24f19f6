import { expect, test } from "bun:test";
import { JOB_INTS, type KernelExports } from "../../src/model/compute/kernel-exports.ts";
import { controlBytes, KernelThreads, writeTouchJob } from "../../src/model/compute/kernel-threads.ts";
import { kernelModule } from "../../src/model/compute/matmul.ts";
import { StallBackoff } from "../../src/model/compute/stall-backoff.ts";

test("a lone stall backs off briefly; stalls close together double the backoff up to its cap", () => {
  const b = new StallBackoff(0.5, 2, 50);
  b.note(0.4, 1000); // waited, but not a stall
  expect(b.available(1000)).toBe(true);
  b.note(3, 1000);
  expect(b.currentMs).toBe(2);
  expect(b.available(1001.9)).toBe(false);
  expect(b.available(1002)).toBe(true);
  // Each stall within 50 ms of the last backoff's end: 4, 8, 16, 32, then 50 at most.
  let now = 1002;
  for (const want of [4, 8, 16, 32, 50, 50]) {
    now += 10;
    b.note(5, now);
    expect(b.currentMs).toBe(want);
    expect(b.available(now + want - 0.01)).toBe(false);
    now += want;
  }
});

test("after 50 ms without a stall, the next stall backs off briefly again", () => {
  const b = new StallBackoff(0.5, 2, 50);
  b.note(5, 0);
  b.note(5, 10);
  b.note(5, 30);
  expect(b.currentMs).toBe(8);
  b.note(5, 38 + 50.5); // the last backoff ended at 38
  expect(b.currentMs).toBe(2);
  expect(b.available(88.5 + 2)).toBe(true);
});

test("a wait within twice the caller's chunk time is a helper's last chunk, not a stall", () => {
  const b = new StallBackoff(0.5, 2, 50);
  // A prefill's chunks take milliseconds: waiting 6 ms for the helper's last 4 ms chunk is normal.
  b.note(6, 1000, 4);
  expect(b.available(1000)).toBe(true);
  expect(b.currentMs).toBe(0);
  // 9 ms is more than twice a 4 ms chunk plus 0.5: the helper lost its core.
  b.note(9, 1000, 4);
  expect(b.currentMs).toBe(2);
  expect(b.available(1001)).toBe(false);
});

test("KernelThreads backs off when the caller waited far past its own chunks' time, and never judges a caller that took none", async () => {
  // The helper's work: first writes to 32 MiB of fresh pages, 8192 page faults (milliseconds,
  // far past the 0.5 ms stall line). The caller's kernel is a stand-in that claims nothing and
  // says it computed `took` chunks at once: every chunk is the helper's, and the caller waits.
  // (Unless the caller itself lost its core between opening the dispatch and joining it, and
  // found it done: then nothing was waited for, and a fresh memory is tried again.)
  const dispatch = async (took: number): Promise<boolean> => {
    const ctrl = 4096;
    const jobsAt = ctrl + controlBytes(1) + 64;
    const from = 1 << 16;
    const bytes = 32 << 20;
    const pages = (from + bytes) / 65536;
    const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared: true });
    const threads = new KernelThreads(kernelModule()!, memory, 1, ctrl);
    try {
      await threads.ready;
      const j = new Int32Array(memory.buffer, jobsAt, JOB_INTS);
      writeTouchJob(j, from, from + bytes);
      const caller = { run_chunks: () => took } as unknown as KernelExports;
      threads.run(caller, j, 1, 0, 0);
      expect(threads.helperChunks).toBeGreaterThan(0);
      return threads.available;
    } finally {
      threads.close();
    }
  };
  // took 1: its chunk took microseconds and it waited milliseconds, a stall.
  let backedOff = false;
  for (let attempt = 0; attempt < 5 && !backedOff; attempt++) backedOff = !(await dispatch(1));
  expect(backedOff).toBe(true);
  // took 0: it started late (the helper had taken everything), which says nothing of the helper.
  for (let attempt = 0; attempt < 3; attempt++) expect(await dispatch(0)).toBe(true);
});
