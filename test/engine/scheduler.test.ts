// The Scheduler on its own, over a KvCacheManager and no model: which rows a step takes, in what
// order sequences are admitted and preempted, and that the queues and blocks agree after every
// plan whatever arrives, computes and finishes.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { KvCacheManager } from "../../src/engine/kv-cache-manager.ts";
import { Scheduler } from "../../src/engine/scheduler.ts";
import { Sequence, type SamplingParams } from "../../src/engine/sequence.ts";
import { Step } from "../../src/engine/step.ts";
import { KvPool } from "../../src/pool/index.ts";

const shape = { blockTokens: 4, nLayers: 1, nKvHeads: 1, headDim: 2 };
const B = shape.blockTokens;
const greedy: SamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, maxTokens: 100, stopTokenIds: [] };

function setup(blocks: number, maxBatchTokens = 16, maxRunning = 8) {
  const pool = new KvPool(shape, blocks);
  const kv = new KvCacheManager(pool);
  const failed: [string, string][] = [];
  const stats = { prefixHitTokens: 0, preemptions: 0 };
  const scheduler = new Scheduler({
    kv,
    maxBatchTokens,
    maxRunning,
    maxModelLen: 1000,
    now: () => 0,
    fail: (seq, error) => {
      failed.push([seq.requestId, error]);
      scheduler.freeBlocks(seq);
      scheduler.remove(seq);
    },
    stats,
  });
  const seq = (id: string, prompt: number) =>
    new Sequence({
      requestId: id,
      promptTokens: Array.from({ length: prompt }, (_, i) => (i * 7 + id.charCodeAt(id.length - 1)) % 50),
      sampling: greedy,
      rng: null,
      prefillOnly: false,
      prefillChoices: 1,
      onToken: () => {},
      onFinish: () => {},
      vocabSize: 64,
      kv: kv.open(),
      constraint: null,
    });
  const step = () => new Step(pool, new Float32Array(0), () => {});
  /** What postprocess does with a step: positions computed, and a token appended where a row reached its end. */
  const compute = (s: Step) => {
    for (let r = 0; r < s.rows; r++) {
      const q = s.seqs[r]!;
      const from = q.numComputed;
      q.numComputed += s.counts[r]!;
      q.hashUpTo(q.numComputed, B);
      kv.markComputed(q.kv, q.hashes, from, q.numComputed);
      if (q.numComputed === q.tokens.length) {
        q.tokens.push(1);
        q.outputCount++;
      }
    }
  };
  const rows = (s: Step) => s.seqs.slice(0, s.rows).map((q, r) => [q.requestId, s.counts[r]]);
  return { pool, kv, scheduler, seq, step, compute, rows, failed, stats };
}

describe("Scheduler", () => {
  test("running sequences first, then waiting ones in arrival order while the token budget lasts", () => {
    const { scheduler, seq, step, compute, rows } = setup(32, 16);
    const a = seq("a", 10);
    scheduler.enqueue(a);
    let s = step();
    expect(scheduler.plan(s)).toBe(true);
    expect(rows(s)).toEqual([["a", 10]]);
    compute(s);
    for (const id of ["b", "c", "d"]) scheduler.enqueue(seq(id, 9));
    s = step();
    scheduler.plan(s);
    // a decodes one token; b takes 9; c the 6 left of the budget (a prefill chunk); d waits.
    expect(rows(s)).toEqual([
      ["a", 1],
      ["b", 9],
      ["c", 6],
    ]);
    expect(scheduler.running.map((q) => q.requestId)).toEqual(["a", "b", "c"]);
    expect(scheduler.waiting.map((q) => q.requestId)).toEqual(["d"]);
  });

  test("maxRunning caps admission", () => {
    const { scheduler, seq, step, rows } = setup(32, 64, 2);
    for (const id of ["a", "b", "c"]) scheduler.enqueue(seq(id, 3));
    const s = step();
    scheduler.plan(s);
    expect(rows(s).map((r) => r[0])).toEqual(["a", "b"]);
    expect(scheduler.waiting.map((q) => q.requestId)).toEqual(["c"]);
  });

  test("a short pool preempts the newest running sequence, which waits at the front holding nothing", () => {
    const { pool, scheduler, seq, step, compute, rows, stats } = setup(5, 64);
    const a = seq("a", 8);
    const b = seq("b", 8);
    scheduler.enqueue(a);
    scheduler.enqueue(b);
    let s = step();
    scheduler.plan(s);
    compute(s);
    // Both prompts took 2 blocks each; each decode needs a third: one is left, so b gives way.
    expect(pool.used).toBe(4);
    s = step();
    scheduler.plan(s);
    expect(rows(s)).toEqual([["a", 1]]);
    expect(scheduler.running).toEqual([a]);
    expect(scheduler.waiting).toEqual([b]);
    expect(b.kv.count).toBe(0);
    expect(b.numComputed).toBe(0);
    expect([b.preemptions, stats.preemptions]).toEqual([1, 1]);
    expect(a.kv.count).toBe(3);
  });

  test("a sequence the pool cannot hold alone fails, and its blocks go to the next in line", () => {
    const { scheduler, seq, step, compute, failed } = setup(3, 64);
    const a = seq("a", 12);
    scheduler.enqueue(a);
    let s = step();
    scheduler.plan(s);
    compute(s);
    const b = seq("b", 5);
    scheduler.enqueue(b);
    s = step();
    scheduler.plan(s);
    // a needs a fourth block for its decode and is alone: out of blocks (an error, not a cut-off).
    expect(failed).toEqual([["a", "out of KV blocks: 13 tokens need 1 more blocks, 0 of 3 available"]]);
    expect(scheduler.running).toEqual([b]);
  });

  test("a waiting sequence that does not fit yet holds nothing, not even its prefix hits", () => {
    const { scheduler, seq, step, compute, pool } = setup(4, 64);
    const a = seq("a", 12);
    scheduler.enqueue(a);
    let s = step();
    scheduler.plan(s);
    compute(s);
    // Its first 8 tokens are cached (a's), its ninth needs a block the pool no longer has.
    const twin = seq("a", 9);
    scheduler.enqueue(twin);
    s = step();
    scheduler.plan(s);
    expect(scheduler.waiting).toEqual([twin]);
    expect([twin.kv.count, twin.numComputed]).toEqual([0, 0]);
    expect(a.kv.ids.map((id) => pool.refCount(id))).toEqual([1, 1, 1, 1]);
  });

  test("a waiting sequence starts from the cached blocks of its prompt, and they count as prefix hits", () => {
    const { scheduler, seq, step, compute, rows, stats } = setup(16, 64);
    const a = seq("a", 9);
    scheduler.enqueue(a);
    let s = step();
    scheduler.plan(s);
    compute(s);
    const twin = seq("a", 9); // the same tokens
    scheduler.enqueue(twin);
    s = step();
    scheduler.plan(s);
    expect(rows(s)).toEqual([
      ["a", 1],
      ["a", 1],
    ]);
    expect(twin.kv.ids.slice(0, 2)).toEqual(a.kv.ids.slice(0, 2));
    expect([twin.prefixHitTokens, stats.prefixHitTokens]).toEqual([8, 8]);
  });

  test("planAhead takes a decode of every running row the model samples, and nothing while a sequence waits", () => {
    const { scheduler, seq, step, compute } = setup(16, 64);
    const a = seq("a", 3);
    const b = seq("b", 4);
    scheduler.enqueue(a);
    scheduler.enqueue(b);
    const first = step();
    scheduler.plan(first);
    first.sampling[0] = first.sampling[1] = { cfg: greedy, rng: null };
    const ahead = step();
    ahead.reset(1);
    expect(scheduler.planAhead([first], ahead)).toBe(true);
    expect([ahead.seqs, ahead.counts]).toEqual([
      [a, b],
      [1, 1],
    ]);
    // b's decode at position 5 needs its second block, taken now.
    expect(b.kv.count).toBe(2);
    // A row sampled on this thread: its next token is not known ahead.
    first.sampling[1] = null;
    expect(scheduler.planAhead([first], step())).toBe(false);
    first.sampling[1] = { cfg: greedy, rng: null };
    scheduler.enqueue(seq("c", 2));
    expect(scheduler.planAhead([first], step())).toBe(false);
    compute(first);
  });

  test("queues and blocks agree after every plan, under random arrivals, steps and finishes", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(2), fc.nat(30)), { maxLength: 120 }), (ops) => {
        const { pool, scheduler, seq, step, compute } = setup(10, 12, 4);
        const live = new Set<Sequence>();
        let n = 0;
        for (const [op, arg] of ops) {
          if (op === 0) {
            const q = seq(`r${n++}`, (arg % 14) + 1);
            live.add(q);
            scheduler.enqueue(q);
          } else if (op === 1) {
            const s = step();
            const any = scheduler.plan(s);
            expect(any).toBe(s.rows > 0);
            let tokens = 0;
            for (let r = 0; r < s.rows; r++) {
              const q = s.seqs[r]!;
              tokens += s.counts[r]!;
              expect(q.state).toBe("running");
              // Its blocks cover every position the step computes.
              expect(q.kv.count * B).toBeGreaterThanOrEqual(q.numComputed + s.counts[r]!);
            }
            expect(tokens).toBeLessThanOrEqual(12);
            expect(new Set(s.seqs.slice(0, s.rows)).size).toBe(s.rows);
            compute(s);
          } else if (op === 2 && scheduler.running.length > 0) {
            const q = scheduler.running[arg % scheduler.running.length]!;
            scheduler.freeBlocks(q);
            scheduler.remove(q);
          }
          for (const q of live) if (q.state === "finished") live.delete(q);
          // Each live sequence in exactly one queue; waiting ones hold nothing between steps.
          for (const q of live) {
            const inRunning = scheduler.running.includes(q);
            const inWaiting = scheduler.waiting.includes(q);
            expect(inRunning !== inWaiting).toBe(true);
            expect(q.state).toBe(inRunning ? "running" : "waiting");
            if (inWaiting && op === 1) expect(q.kv.count).toBe(0);
          }
          expect(scheduler.running.length + scheduler.waiting.length).toBe(live.size);
          expect(scheduler.running.length).toBeLessThanOrEqual(4);
          const held = new Set([...live].flatMap((q) => [...q.kv.ids]));
          expect(pool.used).toBe(held.size);
        }
      }),
      { numRuns: 200 },
    );
  });
});
