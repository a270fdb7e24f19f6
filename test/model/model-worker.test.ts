// The model on its own thread: the same logits and the same K/V bits as the Transformer in this
// thread, over a KV slab both threads share; failures fail the forward, never hang it.
import { afterAll, describe, expect, test } from "bun:test";
import {
  kvShapeOf,
  loadSyntheticModel,
  ModelWorker,
  prevToken,
  type RowSampling,
  type SeqChunk,
  SYNTHETIC_MODEL_NAME,
  Transformer,
} from "../../src/model/index.ts";
import { KvPool } from "../../src/pool/index.ts";
import { placedBytes } from "../../src/model/compute/layer-group.ts";
import { newReadPlan, planInts, readPlan, writePlan } from "../../src/model/thread/model-worker-protocol.ts";
import { sample, stream } from "../../src/rng/index.ts";

/** A row the model greedy-samples itself. */
const G = { cfg: { temperature: 0, topP: 1, topK: 0 }, rng: null };

const m = loadSyntheticModel();
const local = new Transformer(m.cfg, m.weights);
const workers: ModelWorker[] = [];
afterAll(() => {
  for (const w of workers) w.close();
  local.close();
});

async function start(threads = 1): Promise<ModelWorker> {
  const w = await ModelWorker.start({ modelPath: SYNTHETIC_MODEL_NAME, threads, maxSeqLen: 256 });
  workers.push(w);
  return w;
}

/**
 * One forward through ModelWorker.post, as a promise of the rows' sampled tokens (-1 where the
 * thread sampled none). Several may be in flight, ending in the order posted.
 */
function forward(
  w: ModelWorker,
  pool: KvPool,
  batch: readonly SeqChunk[],
  out: Float32Array,
  sampling?: readonly (RowSampling | null)[],
  lazy = false,
): Promise<Int32Array> {
  return new Promise<Int32Array>((resolve, reject) => w.post(pool, batch, out, sampling, lazy, (sampled, e) => (e ? reject(e) : resolve(sampled!))));
}

const prompt = Array.from({ length: 37 }, (_, i) => 32 + ((i * 7) % 90));

/**
 * Runs each step's batch on the worker over `theirs` and on the in-thread Transformer over
 * `mine`: the same logits every step, and the same K/V bytes at the end.
 */
async function expectSameSteps(w: ModelWorker, theirs: KvPool, mine: KvPool, steps: SeqChunk[][]): Promise<void> {
  for (const batch of steps) {
    const want = new Float32Array(batch.length * m.cfg.vocabSize);
    local.forward(mine, batch, want);
    const got = w.logitsBuffer(batch.length);
    await forward(w, theirs, batch, got);
    expect(got.subarray(0, want.length)).toEqual(want);
  }
  // Block by block: a pool split by layer has no one view of its bytes.
  for (let id = 0; id < mine.total; id++) expect(Buffer.from(theirs.payload(id)).equals(Buffer.from(mine.payload(id)))).toBe(true);
}

describe("ModelWorker", () => {
  test("prefill then decode give the in-thread Transformer's logits and K/V bits", async () => {
    const w = await start(2);
    expect(w.info.threads).toBe(2);
    expect(w.info.cfg.vocabSize).toBe(m.cfg.vocabSize);
    const shape = kvShapeOf(m.cfg, 8);
    const mine = new KvPool(shape, 16);
    const theirs = new KvPool(shape, 16, { shared: true });
    const V = m.cfg.vocabSize;
    const want = new Float32Array(2 * V);
    // Two sequences, the second one's table out of order, then one decode step each.
    const tables = [
      [0, 1, 2, 3, 4],
      [9, 7, 8, 5, 6],
    ];
    const steps = [
      tables.map((t, i) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(0, 30 + i) })),
      tables.map((t, i) => ({ blockTable: t, startPos: 30 + i, tokens: [prompt[30 + i]!] })),
    ];
    await expectSameSteps(w, theirs, mine, steps);
    // A caller's own logits buffer is filled too.
    const own = new Float32Array(V);
    const next = [{ blockTable: tables[0]!, startPos: 31, tokens: [5] }];
    await forward(w, theirs, next, own);
    local.forward(mine, next, want);
    expect(own).toEqual(want.subarray(0, V));
    // A bigger batch than any before grows the plan and logits buffers between two forwards.
    const wider = [10, 11, 12].map((id, i) => ({ blockTable: [id], startPos: 0, tokens: prompt.slice(i, i + 8) }));
    const more = new Float32Array(3 * V);
    local.forward(mine, wider, more);
    const got = w.logitsBuffer(3);
    await forward(w, theirs, wider, got);
    expect(got.subarray(0, 3 * V)).toEqual(more);
  });

  test("a KV pool in the thread's kernel memory (kvSlab) gives the same logits and K/V bits", async () => {
    const w = await start(2);
    const shape = kvShapeOf(m.cfg, 8);
    const room = await w.kvSlab(16 * new KvPool(shape, 1).blockBytes);
    expect(room).not.toBeNull();
    const theirs = new KvPool(shape, 16, { segments: room! });
    expect(theirs.slabOffset).toBeGreaterThan(0);
    const mine = new KvPool(shape, 16);
    const tables = [
      [3, 1, 2, 0, 4],
      [9, 7, 8, 5, 6],
    ];
    const steps = [
      tables.map((t, i) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(0, 30 + i) })),
      tables.map((t, i) => ({ blockTable: t, startPos: 30 + i, tokens: [prompt[30 + i]!] })),
      tables.map((t, i) => ({ blockTable: t, startPos: 31 + i, tokens: [7 + i] })),
    ];
    await expectSameSteps(w, theirs, mine, steps);
  });

  test("a model in several memories on the thread takes the KV pool split by layer: the same logits and K/V bits", async () => {
    // About one layer a memory, and the engine's pool counted beside each layer: twice the memories.
    const b = placedBytes(m.cfg, m.weights);
    const groupBytes = 2 * Math.max(b.layer, b.embedding, b.classifier);
    const shape = kvShapeOf(m.cfg, 8);
    const layerShare = new KvPool({ ...shape, nLayers: 1 }, 1).blockBytes;
    const numBlocks = Math.ceil(b.layer / layerShare);
    const apart = await ModelWorker.start({ modelPath: SYNTHETIC_MODEL_NAME, threads: 2, maxSeqLen: 256, groupBytes });
    const w = await ModelWorker.start({ modelPath: SYNTHETIC_MODEL_NAME, threads: 2, maxSeqLen: 256, groupBytes, kvPool: { blockTokens: 8, numBlocks } });
    workers.push(apart, w);
    expect(apart.info.memories).toBeGreaterThan(1);
    expect(w.info.memories).toBeGreaterThan(apart.info.memories);
    const room = await w.kvSlab(numBlocks * new KvPool(shape, 1).blockBytes);
    expect(room!.length).toBeGreaterThan(1);
    const theirs = new KvPool(shape, numBlocks, { segments: room! });
    const mine = new KvPool(shape, numBlocks);
    const tables = [
      [3, 1, 2, 0, 4],
      [9, 7, 8, 5, 6],
    ];
    const steps = [
      tables.map((t, i) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(0, 30 + i) })),
      tables.map((t, i) => ({ blockTable: t, startPos: 30 + i, tokens: [prompt[30 + i]!] })),
      tables.map((t, i) => ({ blockTable: t, startPos: 31 + i, tokens: [7 + i] })),
    ];
    await expectSameSteps(w, theirs, mine, steps);
  });

  test("the caller's event loop keeps turning while a forward runs", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 40, { shared: true });
    const long = Array.from({ length: 250 }, (_, i) => 32 + (i % 90));
    const table = Array.from({ length: 32 }, (_, i) => i);
    let settled = false;
    let turns = 0;
    const tick = () => {
      if (settled) return;
      turns++;
      setImmediate(tick);
    };
    const f = forward(w, pool, [{ blockTable: table, startPos: 0, tokens: long }], w.logitsBuffer(1)).then(() => {
      settled = true;
    });
    setImmediate(tick);
    await f;
    // A forward that blocked this thread (the model on it, or an Atomics.wait) would settle first.
    expect(turns).toBeGreaterThan(0);
  });

  test("pipelined: the next forward posted while one runs, its tokens the model's own greedy samples", async () => {
    const w = await start(2);
    const shape = kvShapeOf(m.cfg, 8);
    const mine = new KvPool(shape, 16);
    const theirs = new KvPool(shape, 16, { shared: true });
    const V = m.cfg.vocabSize;
    const tables = [
      [0, 1, 2, 3, 4],
      [9, 7, 8, 5, 6],
    ];
    // Row 0 greedy from a prefill on; row 1 greedy only from the second step, fed by the caller.
    const local1 = new Float32Array(2 * V);
    const argmax = (l: Float32Array, r: number) => sample(l.subarray(r * V, (r + 1) * V), { temperature: 0, topP: 1, topK: 0 }, null);
    let batch = tables.map((t, i) => ({ blockTable: t, startPos: 0, tokens: prompt.slice(0, 20 + i) }));
    let pending = forward(w, theirs, batch, w.logitsBuffer(2), [G, null]);
    for (let step = 1; step < 6; step++) {
      local.forward(mine, batch, local1);
      const tokens = [argmax(local1, 0), argmax(local1, 1)];
      // Posted before the step before settles: row 0 names its token, row 1 carries the caller's.
      batch = tables.map((t, i) => ({ blockTable: t, startPos: 20 + i + step - 1, tokens: [i === 0 ? prevToken(0) : tokens[1]!] }));
      const next = forward(w, theirs, batch, w.logitsBuffer(2), [G, G]);
      expect(Array.from(await pending)).toEqual(step === 1 ? [tokens[0]!, -1] : tokens);
      pending = next;
      batch[0]!.tokens = [tokens[0]!];
    }
    local.forward(mine, batch, local1);
    expect(Array.from(await pending)).toEqual([argmax(local1, 0), argmax(local1, 1)]);
    expect(Buffer.from(theirs.bytes).equals(Buffer.from(mine.bytes))).toBe(true);
  });

  test("pipelined: a lazy forward settles with the one after it, a forward not lazy at its own end", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 102, { shared: true });
    const long = Array.from({ length: 800 }, (_, i) => 32 + (i % 90));
    const table = Array.from({ length: 100 }, (_, i) => i + 2);
    for (const lazy of [true, false]) {
      const a = forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1), [G], lazy);
      const b = forward(w, pool, [{ blockTable: table, startPos: 0, tokens: long }], w.logitsBuffer(1), [G]);
      const c = forward(w, pool, [{ blockTable: [1], startPos: 0, tokens: [66] }], w.logitsBuffer(1), [G]);
      await a;
      // b is an 800-token prefill: only a lazy a waits for its end.
      const first = await Promise.race([b.then(() => "b"), Bun.sleep(0).then(() => "a alone")]);
      expect(first).toBe(lazy ? "b" : "a alone");
      await Promise.all([b, c]);
    }
  });

  test("pipelined: a forward that names the token of a failed one fails too; the thread keeps serving", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 4, { shared: true });
    // A good greedy step first, so what the failed one's successor must not read is there to read.
    await forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1), [G]);
    const bad = forward(w, pool, [{ blockTable: [0], startPos: 1, tokens: [9999] }], w.logitsBuffer(1), [G]);
    const next = forward(w, pool, [{ blockTable: [0], startPos: 1, tokens: [prevToken(0)] }], w.logitsBuffer(1), [G]);
    const errors = Promise.all([bad.catch((e: Error) => e.message), next.catch((e: Error) => e.message)]);
    const filler = () => forward(w, pool, [{ blockTable: [1], startPos: 0, tokens: [65] }], w.logitsBuffer(1));
    const fillers = [filler(), filler()];
    expect(filler).toThrow(/4 forwards already in flight/);
    await Promise.all(fillers);
    const [badError, nextError] = await errors;
    expect(badError).toMatch(/token 9999 outside vocab 258/);
    expect(nextError).toMatch(/row 0's token of a step that failed/);
    // Row 0 was not sampled here: naming its token is refused.
    await forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1), [null]);
    await expect(forward(w, pool, [{ blockTable: [0], startPos: 1, tokens: [prevToken(0)] }], w.logitsBuffer(1))).rejects.toThrow(/sampled none there/);
  });

  test("post: a forward's end may post the next one, which the same watch waits for; on a closed thread the end comes at once", async () => {
    const w = await start();
    const shape = kvShapeOf(m.cfg, 8);
    const theirs = new KvPool(shape, 2, { shared: true });
    const mine = new KvPool(shape, 2);
    const steps = 12;
    const wakes = w.counters.wakes;
    const got: number[] = [];
    await new Promise<void>((resolve, reject) => {
      const post = (pos: number) =>
        w.post(theirs, [{ blockTable: [0, 1], startPos: pos, tokens: [pos === 0 ? 65 : prevToken(0)] }], w.logitsBuffer(1), [G], false, (sampled, e) => {
          if (e) return reject(e);
          got.push(sampled![0]!);
          if (pos + 1 < steps) post(pos + 1);
          else resolve();
        });
      post(0);
    });
    const want: number[] = [];
    const logits = new Float32Array(m.cfg.vocabSize);
    for (let pos = 0, t = 65; pos < steps; pos++) {
      local.forward(mine, [{ blockTable: [0, 1], startPos: pos, tokens: [t] }], logits);
      want.push((t = sample(logits, G.cfg, null)));
    }
    expect(got).toEqual(want);
    // A wake per forward at most: a second watch started from within an end would wait (and wake) beside the first.
    expect(w.counters.wakes - wakes).toBeLessThanOrEqual(steps);
    w.close();
    let ended = "";
    w.post(theirs, [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1), [G], false, (_, e) => (ended = e!.message));
    expect(ended).toBe("model worker died: closed");
  });

  test("a forward the model refuses fails alone; the thread keeps serving", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 4, { shared: true });
    const out = w.logitsBuffer(1);
    await expect(forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [9999] }], out)).rejects.toThrow(/token 9999 outside vocab 258/);
    await forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [65] }], out);
    expect(Number.isFinite(out[0]!)).toBe(true);
  });

  test("a private slab is refused with what to do", async () => {
    const w = await start();
    expect(() => forward(w, new KvPool(kvShapeOf(m.cfg, 8), 4), [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1))).toThrow(
      /slab must be shared/,
    );
  });

  test("a closed or dead thread fails the forward in flight and every later one", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 40, { shared: true });
    const long = Array.from({ length: 250 }, (_, i) => 32 + (i % 90));
    const table = Array.from({ length: 32 }, (_, i) => i);
    const inFlight = forward(w, pool, [{ blockTable: table, startPos: 0, tokens: long }], w.logitsBuffer(1));
    w.close();
    await expect(inFlight).rejects.toThrow(/model worker died: closed/);
    await expect(forward(w, pool, [{ blockTable: [0], startPos: 0, tokens: [65] }], w.logitsBuffer(1))).rejects.toThrow(/model worker died/);
  });

  test("a thread that dies mid-forward fails it at once", async () => {
    const w = await start();
    const pool = new KvPool(kvShapeOf(m.cfg, 8), 40, { shared: true });
    const long = Array.from({ length: 250 }, (_, i) => 32 + (i % 90));
    const table = Array.from({ length: 32 }, (_, i) => i);
    const inFlight = forward(w, pool, [{ blockTable: table, startPos: 0, tokens: long }], w.logitsBuffer(1));
    // As a crash would: the thread goes away without a word.
    (w as unknown as { worker: Worker }).worker.terminate();
    await expect(inFlight).rejects.toThrow(/model worker died: thread exited/);
  });

  test("a model that does not load fails start with the loader's message", async () => {
    await expect(ModelWorker.start({ modelPath: "/nonexistent/model.gguf" })).rejects.toThrow(/nonexistent/);
  });
});

describe("plan buffers", () => {
  test("a plan reads back as written, into the same row records plan after plan (prevToken resolved)", () => {
    const B = 4;
    const rng = stream(77, "sample");
    rng.advance(9n);
    const cfg = { temperature: 0.7, topP: 0.9, topK: 12 };
    const prefill: SeqChunk[] = [
      { blockTable: [5, 2, 9], startPos: 0, tokens: [10, 11, 12, 13, 14, 15] },
      { blockTable: [7], startPos: 3, tokens: [20] },
    ];
    const buf = new Int32Array(planInts(prefill, B));
    const into = newReadPlan();
    writePlan(buf, prefill, B, [null, { cfg, rng }]);
    const first = readPlan(buf, null, into);
    expect(first.chunks.map((c) => [c.startPos, Array.from(c.tokens), Array.from(c.blockTable)])).toEqual([
      [0, [10, 11, 12, 13, 14, 15], [5, 2]],
      [3, [20], [7]],
    ]);
    expect(first.sampling[0]).toBeNull();
    expect(first.sampling[1]!.cfg).toEqual(cfg);
    expect([first.sampling[1]!.rng!.state, first.sampling[1]!.rng!.inc]).toEqual([rng.state, rng.inc]);
    const [chunk0, chunk1, row1, stream1] = [first.chunks[0], first.chunks[1], first.sampling[1], first.sampling[1]!.rng];

    const decode: SeqChunk[] = [
      { blockTable: [5, 2, 9], startPos: 6, tokens: [prevToken(1)] },
      { blockTable: [7], startPos: 4, tokens: [prevToken(0)] },
    ];
    rng.uniformF64();
    writePlan(buf, decode, B, [G, { cfg, rng }]);
    const next = readPlan(buf, Int32Array.from([41, 42]), into);
    expect(next.chunks.map((c) => [c.startPos, Array.from(c.tokens), Array.from(c.blockTable)])).toEqual([
      [6, [42], [5, 2]],
      [4, [41], [7]],
    ]);
    expect(next.sampling[0]!.cfg).toEqual(G.cfg);
    expect(next.sampling[0]!.rng).toBeNull();
    expect(next.sampling[1]!.rng!.state).toBe(rng.state);
    // The same records, refilled: reading a decode's plan allocates none.
    for (const [a, b] of [
      [next.chunks[0], chunk0],
      [next.chunks[1], chunk1],
      [next.sampling[1], row1],
      [next.sampling[1]!.rng, stream1],
    ])
      expect(a).toBe(b);
    expect(() => readPlan(buf, null, into)).toThrow("of a step that failed");
  });
});
