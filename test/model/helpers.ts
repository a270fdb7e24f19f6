import { expect } from "bun:test";
import { type MatmulKernel, matmul, matmulRef } from "../../src/model/compute/matmul.ts";
import type { Matrix } from "../../src/model/compute/packed.ts";
import { KvPool } from "../../src/pool/index.ts";
import { type ModelConfig, type SeqChunk, Transformer, kvShapeOf } from "../../src/model/index.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";

export const TINY: ModelConfig = {
  name: "tiny",
  dim: 32,
  hiddenDim: 64,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  vocabSize: 64,
  maxSeqLen: 64,
  ropeTheta: 10000,
  normEps: 1e-5,
};

export const B = 4;

export function tinyModel(seed = 7, cfg: ModelConfig = TINY): Transformer {
  return new Transformer(cfg, syntheticWeights(cfg, seed));
}

export function newPool(cfg: ModelConfig = TINY, blocks = 64): KvPool {
  return new KvPool(kvShapeOf(cfg, B), blocks);
}

/** Deterministic pseudo-random token ids. */
export function tokens(n: number, seed: number, vocab = TINY.vocabSize): number[] {
  const out: number[] = [];
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(s % vocab);
  }
  return out;
}

/** A sequence holding its blocks in one pool; grows its block table as positions are added. */
export class Seq {
  readonly blockTable: number[] = [];
  pos = 0;
  constructor(readonly pool: KvPool) {}

  chunk(toks: readonly number[]): SeqChunk {
    const need = Math.ceil((this.pos + toks.length) / this.pool.shape.blockTokens);
    while (this.blockTable.length < need) this.blockTable.push(this.pool.allocate(1)![0]!);
    const c: SeqChunk = { blockTable: this.blockTable, startPos: this.pos, tokens: toks };
    this.pos += toks.length;
    return c;
  }
}

/** Runs one chunk alone; returns its last-position logits. */
export function step(m: Transformer, seq: Seq, toks: readonly number[]): Float32Array {
  const out = new Float32Array(m.cfg.vocabSize);
  m.forward(seq.pool, [seq.chunk(toks)], out);
  return out;
}

export function argmax(a: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i]! > a[best]!) best = i;
  return best;
}

/** Bitwise equality of two float arrays (distinguishes -0 and NaN payloads). */
/**
 * The copying matmul and `placed`'s kernel over `w` (from `wOff`) give, bit for bit, `want`; without
 * `want`, what matmulRef gives on the same `w`; with it, matmulRef on `w` must give `want` too.
 */
export function expectMatmulsGive(
  placed: MatmulKernel,
  x: Float32Array,
  w: Matrix,
  shape: { wOff: number; rows: number; n: number; d: number },
  want?: Float32Array,
): void {
  const { wOff, rows, n, d } = shape;
  const run = (mul: typeof matmul) => {
    const y = new Float32Array(rows * d);
    mul(y, x, w, wOff, rows, n, d);
    return bits(y);
  };
  const viaRef = run(matmulRef);
  const expected = want ? bits(want) : viaRef;
  expect(run(matmul)).toEqual(expected);
  expect(run((...a) => placed.matmul(...a))).toEqual(expected);
  if (want) expect(viaRef).toEqual(expected);
}

export function bits(a: Float32Array): number[] {
  return Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
}

/** A reference matmul's bits: y of `rows` x d for x against w's d rows of n from element wOff. */
export type RefBits<W extends Matrix> = (x: Float32Array, w: W, wOff: number, rows: number, n: number, d: number) => number[];

/**
 * For each token-row count, each slice [r0, r0 + d) of w's rows of n (whole matrices, slices
 * from strip starts and from inside strips, odd lengths): k's bits are ref's, on x from input.
 */
export function expectSlices<W extends Matrix>(
  k: MatmulKernel,
  w: W,
  n: number,
  rowCounts: Iterable<number>,
  slices: readonly (readonly [number, number])[],
  input: (rows: number, n: number, seed: number) => Float32Array,
  ref: RefBits<W>,
): void {
  for (const rows of rowCounts) {
    const x = input(rows, n, rows);
    for (const [r0, d] of slices) {
      const y = new Float32Array(rows * d);
      k.matmul(y, x, w, r0 * n, rows, n, d);
      expect(bits(y)).toEqual(ref(x, w, r0 * n, rows, n, d));
    }
  }
}
