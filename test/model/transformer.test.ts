import { describe, expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { Transformer, kvShapeOf, type ModelConfig } from "../../src/model/index.ts";
import { syntheticWeights, type Weights } from "../../src/model/compute/weights.ts";
import { MatmulKernel, matmul } from "../../src/model/compute/matmul.ts";
import { B, Seq, TINY, argmax, bits, expectMatmulsGive, newPool, step, tinyModel, tokens } from "./helpers.ts";

describe("matmul", () => {
  test("tiled kernel equals naive bitwise", () => {
    // The SIMD kernel against the fixed order written out in JS: every n % 4 tail, every weight
    // row remainder of the 8- and 4-row strips, odd and even token rows, placed and copied w.
    for (const n of [1, 3, 4, 37, 40]) {
      for (const d of [1, 3, 4, 6, 9, 17]) {
        const w = new Float32Array(d * n + 5).map((_, i) => Math.sin(i * 1.7));
        const placed = new MatmulKernel([w]);
        for (let rows = 1; rows <= 10; rows++) {
          const x = new Float32Array(rows * n).map((_, i) => Math.cos(i * 0.3));
          expectMatmulsGive(placed, x, w, { wOff: 5, rows, n, d });
        }
      }
    }
  });

  test("matmul order is f32 lanes mod 4", () => {
    // 2^24 + 1 is not an f32 (it rounds to 2^24, ties to even), so where the ones land tells the
    // order apart. x is all ones: each output is a plain sum of the weight row.
    const sum = (row: number[]): number => {
      const y = new Float32Array(1);
      matmul(y, new Float32Array(row.length).fill(1), new Float32Array(row), 0, 1, row.length, 1);
      return y[0]!;
    };
    const big = 2 ** 24;
    // f32, not f64: lane 0 and then the tail each drop a 1 (an f64 sum would give 2^24 + 2).
    expect(sum([big, 0, 0, 0, 1, 0, 0, 0, 1])).toBe(big);
    // Lanes, not one running sum: lane 1 holds 1 + 1 = 2 (a sequential f32 sum loses both ones).
    expect(sum([big, 1, 0, 0, 0, 1, 0, 0])).toBe(big + 2);
    // Folded as (s0 + s1) + (s2 + s3), not ((s0 + s1) + s2) + s3.
    expect(sum([big, 0, 1, 1])).toBe(big + 2);
  });
});

describe("transformer", () => {
  test("batch invariance", () => {
    const m = tinyModel();
    const a = tokens(13, 1);
    // Alone: prefill then three greedy decode steps.
    const alone: Float32Array[] = [];
    {
      const s = new Seq(newPool());
      let out = step(m, s, a);
      alone.push(out);
      for (let i = 0; i < 3; i++) {
        out = step(m, s, [argmax(out)]);
        alone.push(out);
      }
    }
    // In a batch of 3 with other sequences at other positions, some prefilling, some decoding.
    const pool = newPool();
    const s = new Seq(pool);
    const o1 = new Seq(pool);
    const o2 = new Seq(pool);
    step(m, o2, tokens(9, 2));
    const V = TINY.vocabSize;
    const out = new Float32Array(3 * V);
    m.forward(pool, [o1.chunk(tokens(7, 3)), s.chunk(a), o2.chunk([5])], out);
    const batched = [out.slice(V, 2 * V)];
    for (let i = 0; i < 3; i++) {
      const next = argmax(batched[batched.length - 1]!);
      const o = new Float32Array(3 * V);
      // Vary the sequence's slot in the batch and the company it keeps.
      const others = [o1.chunk([i + 1]), o2.chunk(tokens(i + 2, 10 + i))];
      const order = i % 2 === 0 ? [s.chunk([next]), ...others] : [...others, s.chunk([next])];
      m.forward(pool, order, o);
      const at = i % 2 === 0 ? 0 : 2;
      batched.push(o.slice(at * V, (at + 1) * V));
    }
    for (let i = 0; i < alone.length; i++) expect(bits(batched[i]!)).toEqual(bits(alone[i]!));
  });

  test("chunk invariance", () => {
    const m = tinyModel();
    const p = tokens(13, 4);
    const one = step(m, new Seq(newPool()), p);
    const s2 = new Seq(newPool());
    step(m, s2, p.slice(0, 5));
    const two = step(m, s2, p.slice(5));
    const s3 = new Seq(newPool());
    let each: Float32Array = new Float32Array(0);
    for (const t of p) each = step(m, s3, [t]);
    expect(bits(two)).toEqual(bits(one));
    expect(bits(each)).toEqual(bits(one));
    // Prefill chunks also leave the same cache bytes behind.
    const a = new Seq(newPool());
    step(m, a, p);
    expect(a.pool.payload(a.blockTable[2]!)).toEqual(s3.pool.payload(s3.blockTable[2]!));
  });

  test("chunk invariance across attention tiles", () => {
    // 40 tokens span several 16-row attention tiles; two chunks split them differently again.
    const cfg: ModelConfig = { ...TINY, maxSeqLen: 48 };
    const w = syntheticWeights(cfg, 5);
    const m = new Transformer(cfg, w);
    const pool = () => new KvPool(kvShapeOf(cfg, B), 16);
    const p = tokens(40, 9);
    const one = step(m, new Seq(pool()), p);
    const s2 = new Seq(pool());
    step(m, s2, p.slice(0, 17));
    const two = step(m, s2, p.slice(17));
    const s3 = new Seq(pool());
    let each: Float32Array = new Float32Array(0);
    for (const t of p) each = step(m, s3, [t]);
    expect(bits(two)).toEqual(bits(one));
    expect(bits(each)).toEqual(bits(one));
    const ref = new Reference(cfg, w);
    let want: Float32Array = new Float32Array(0);
    for (let i = 0; i < p.length; i++) want = ref.forward(p[i]!, i);
    expectClose(one, want, 1e-4);
  });

  test("fills follow positions", () => {
    const m = tinyModel();
    const s = new Seq(newPool());
    step(m, s, tokens(6, 5));
    expect(s.blockTable.map((id) => s.pool.fillOf(id))).toEqual([4, 2]);
    step(m, s, tokens(3, 6));
    expect(s.blockTable.map((id) => s.pool.fillOf(id))).toEqual([4, 4, 1]);
  });

  test("kv transfer gives identical logits", () => {
    const m = tinyModel();
    const p = tokens(11, 8);
    const src = new Seq(newPool());
    const first = step(m, src, p);
    const next = argmax(first);
    const want = step(m, src, [next]);

    // Blocks travel one by one into a pool where they land at other ids.
    const dst = newPool(TINY, 32);
    const taken = dst.allocate(7)!;
    const table: number[] = [];
    for (const id of src.blockTable.slice(0, 3)) {
      const [rec] = src.pool.export([id]);
      table.push(dst.import([{ ...rec!, payload: rec!.payload.slice() }])![0]!);
    }
    expect(table.some((id, i) => id !== src.blockTable[i])).toBe(true);
    expect(taken.length).toBe(7);
    const out = new Float32Array(TINY.vocabSize);
    m.forward(dst, [{ blockTable: table, startPos: p.length, tokens: [next] }], out);
    expect(bits(out)).toEqual(bits(want));
  });

  test("reference forward agrees", () => {
    const cfg: ModelConfig = { ...TINY, maxSeqLen: 32 };
    const w = syntheticWeights(cfg, 11);
    const m = new Transformer(cfg, w);
    const ref = new Reference(cfg, w);
    const s = new Seq(new KvPool(kvShapeOf(cfg, B), 16));
    const p = tokens(10, 12);
    let got: Float32Array = step(m, s, p.slice(0, 6));
    let want: Float32Array = new Float32Array(0);
    for (let i = 0; i < 6; i++) want = ref.forward(p[i]!, i);
    expectClose(got, want, 1e-4);
    got = step(m, s, p.slice(6));
    for (let i = 6; i < 10; i++) want = ref.forward(p[i]!, i);
    expectClose(got, want, 1e-4);
    // Not trivially equal: the logits do vary by token.
    expect(Math.max(...got) - Math.min(...got)).toBeGreaterThan(1);
  });

  test("reference forward agrees with head dim and biases", () => {
    // head_dim 16 over dim 32 with 4 heads (qDim 64 != dim), q/k/v biases, theta 1e6.
    const cfg: ModelConfig = { ...TINY, maxSeqLen: 32, headDim: 16, ropeTheta: 1e6 };
    const w = syntheticWeights(cfg, 17, { biases: true, sharedClassifier: true });
    const m = new Transformer(cfg, w);
    const ref = new Reference(cfg, w);
    const s = new Seq(new KvPool(kvShapeOf(cfg, B), 16));
    expect(s.pool.shape.headDim).toBe(16);
    const p = tokens(9, 5);
    let got: Float32Array = step(m, s, p.slice(0, 5));
    let want: Float32Array = new Float32Array(0);
    for (let i = 0; i < 5; i++) want = ref.forward(p[i]!, i);
    expectClose(got, want, 1e-4);
    got = step(m, s, p.slice(5));
    for (let i = 5; i < 9; i++) want = ref.forward(p[i]!, i);
    expectClose(got, want, 1e-4);
  });

  test("shared classifier and gqa shapes", () => {
    // MHA (nKvHeads = nHeads), MQA (1), and a dim not divisible by 4 rows in the kernels.
    for (const cfg of [
      { ...TINY, nKvHeads: 4 },
      { ...TINY, nKvHeads: 1, vocabSize: 61, hiddenDim: 50 },
    ]) {
      const w = syntheticWeights(cfg, 3, { sharedClassifier: true });
      expect(w.wcls).toBe(w.tokenEmbedding);
      const m = new Transformer(cfg, w);
      const ref = new Reference(cfg, w);
      const s = new Seq(new KvPool(kvShapeOf(cfg, B), 16));
      const p = tokens(7, 13, cfg.vocabSize);
      const got = step(m, s, p);
      let want: Float32Array = new Float32Array(0);
      for (let i = 0; i < p.length; i++) want = ref.forward(p[i]!, i);
      expectClose(got, want, 1e-4);
    }
  });

  test("a growing batch allocates its scratch anew in its own place, with the same logits", () => {
    // 5 rows, 12, then 40: the scratch doubles past each, and each time it was the memory's last
    // allocation (the pool's slab came before), so a model that grew holds what one sized for
    // 40 rows from the start holds.
    const grown = tinyModel();
    const fresh = tinyModel();
    const pg = grown.kvPool(kvShapeOf(TINY, B), 64);
    const pf = fresh.kvPool(kvShapeOf(TINY, B), 64);
    step(grown, new Seq(pg), tokens(5, 1));
    step(grown, new Seq(pg), tokens(12, 2));
    const toks = tokens(40, 3);
    const a = step(grown, new Seq(pg), toks);
    const b = step(fresh, new Seq(pf), toks);
    expect(bits(a)).toEqual(bits(b));
    expect(grown.kernelBytes).toBe(fresh.kernelBytes);
    // And the smaller batches after it run in the grown scratch.
    const s = new Seq(pf);
    expect(bits(step(grown, new Seq(pg), tokens(7, 4)))).toEqual(bits(step(fresh, s, tokens(7, 4))));
    expect(grown.kernelBytes).toBe(fresh.kernelBytes);
    grown.close();
    fresh.close();
  });

  test("what was allocated after the scratch is never given back with it", () => {
    // The slab comes after a first forward's scratch, so the next growth moves only the rows up
    // past it; the one after gives back only those, and the K/V the slab holds stays whole.
    const m = tinyModel();
    const ref = tinyModel();
    step(m, new Seq(newPool()), tokens(5, 1));
    const pm = m.kvPool(kvShapeOf(TINY, B), 64);
    const pr = newPool();
    const [sm, sr] = [new Seq(pm), new Seq(pr)];
    for (const [n, seed] of [
      [12, 2],
      [40, 3],
      [1, 4],
    ] as const) {
      expect(bits(step(m, sm, tokens(n, seed)))).toEqual(bits(step(ref, sr, tokens(n, seed))));
    }
    m.close();
    ref.close();
  });

  test("rejects bad chunks", () => {
    const m = tinyModel();
    const pool = newPool();
    const out = new Float32Array(TINY.vocabSize);
    expect(() => m.forward(pool, [{ blockTable: [0], startPos: 0, tokens: [1, 2, 3, 4, 5] }], out)).toThrow(/needs 2 blocks/);
    expect(() => m.forward(pool, [{ blockTable: [0], startPos: 0, tokens: [64] }], out)).toThrow(/outside vocab/);
    expect(() => m.forward(pool, [{ blockTable: [0], startPos: 0, tokens: [] }], out)).toThrow(/no tokens/);
    expect(() => m.forward(new KvPool({ ...kvShapeOf(TINY, B), nLayers: 3 }, 4), [{ blockTable: [0], startPos: 0, tokens: [1] }], out)).toThrow(/does not fit/);
  });
});

function expectClose(got: Float32Array, want: Float32Array, tol: number): void {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
  expect(worst).toBeLessThan(tol);
}

/**
 * run.c's forward written out plainly, one position at a time, with a dense f16 K/V cache;
 * also Qwen2's q/k/v biases and a head_dim that is not dim / nHeads.
 */
class Reference {
  private readonly kc: Float16Array[];
  private readonly vc: Float16Array[];
  constructor(
    private readonly c: ModelConfig,
    private readonly w: Weights,
  ) {
    const kvDim = (c.headDim ?? c.dim / c.nHeads) * c.nKvHeads;
    this.kc = Array.from({ length: c.nLayers }, () => new Float16Array(c.maxSeqLen * kvDim));
    this.vc = Array.from({ length: c.nLayers }, () => new Float16Array(c.maxSeqLen * kvDim));
  }

  forward(token: number, pos: number): Float32Array {
    const { c, w } = this;
    const hs = c.headDim ?? c.dim / c.nHeads;
    const qDim = hs * c.nHeads;
    const kvDim = hs * c.nKvHeads;
    const kvMul = c.nHeads / c.nKvHeads;
    const x = Float32Array.from(w.tokenEmbedding.subarray(token * c.dim, (token + 1) * c.dim));
    const mm = (W: Float32Array, off: number, v: Float32Array, d: number): Float32Array => {
      const o = new Float32Array(d);
      for (let i = 0; i < d; i++) {
        let s = 0;
        for (let j = 0; j < v.length; j++) s += W[off + i * v.length + j]! * v[j]!;
        o[i] = s;
      }
      return o;
    };
    const norm = (v: Float32Array, g: Float32Array, off: number): Float32Array => {
      let ss = 0;
      for (const e of v) ss += e * e;
      const k = 1 / Math.sqrt(ss / v.length + c.normEps);
      return v.map((e, i) => g[off + i]! * (k * e));
    };
    for (let l = 0; l < c.nLayers; l++) {
      const xb = norm(x, w.rmsAtt, l * c.dim);
      const q = mm(w.wq, l * qDim * c.dim, xb, qDim);
      const k = mm(w.wk, l * kvDim * c.dim, xb, kvDim);
      const v = mm(w.wv, l * kvDim * c.dim, xb, kvDim);
      if (w.bq) {
        for (let i = 0; i < qDim; i++) q[i]! += w.bq[l * qDim + i]!;
        for (let i = 0; i < kvDim; i++) k[i]! += w.bk![l * kvDim + i]!;
        for (let i = 0; i < kvDim; i++) v[i]! += w.bv![l * kvDim + i]!;
      }
      for (let i = 0; i < qDim; i += 2) {
        const f = 1 / Math.pow(c.ropeTheta, (i % hs) / hs);
        const cs = Math.cos(pos * f);
        const sn = Math.sin(pos * f);
        for (const vec of i < kvDim ? [q, k] : [q]) {
          const a = vec[i]!;
          const b = vec[i + 1]!;
          vec[i] = a * cs - b * sn;
          vec[i + 1] = a * sn + b * cs;
        }
      }
      this.kc[l]!.set(k, pos * kvDim);
      this.vc[l]!.set(v, pos * kvDim);
      const out = new Float32Array(qDim);
      for (let h = 0; h < c.nHeads; h++) {
        const kvh = Math.floor(h / kvMul);
        const att = new Float32Array(pos + 1);
        for (let t = 0; t <= pos; t++) {
          let s = 0;
          for (let i = 0; i < hs; i++) s += q[h * hs + i]! * this.kc[l]![t * kvDim + kvh * hs + i]!;
          att[t] = s / Math.sqrt(hs);
        }
        const mx = Math.max(...att);
        let sum = 0;
        for (let t = 0; t <= pos; t++) {
          att[t] = Math.exp(att[t]! - mx);
          sum += att[t]!;
        }
        for (let t = 0; t <= pos; t++) {
          for (let i = 0; i < hs; i++) out[h * hs + i]! += (att[t]! / sum) * this.vc[l]![t * kvDim + kvh * hs + i]!;
        }
      }
      const o = mm(w.wo, l * c.dim * qDim, out, c.dim);
      for (let i = 0; i < c.dim; i++) x[i]! += o[i]!;
      const xb2 = norm(x, w.rmsFfn, l * c.dim);
      const h1 = mm(w.w1, l * c.hiddenDim * c.dim, xb2, c.hiddenDim);
      const h3 = mm(w.w3, l * c.hiddenDim * c.dim, xb2, c.hiddenDim);
      for (let i = 0; i < c.hiddenDim; i++) h1[i] = (h1[i]! / (1 + Math.exp(-h1[i]!))) * h3[i]!;
      const f = mm(w.w2, l * c.dim * c.hiddenDim, h1, c.dim);
      for (let i = 0; i < c.dim; i++) x[i]! += f[i]!;
    }
    return mm(w.wcls, 0, norm(x, w.rmsFinal, 0), c.vocabSize);
  }
}
