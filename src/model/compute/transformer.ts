import assert from "node:assert";
import type { KvShape } from "../../codec/index.ts";
import { decodeHeadsPerPiece } from "./attention-pieces.ts";
import { KvPool, type KvSegment, type KvSegmentRoom } from "../../pool/index.ts";
import { blockPayloadBytes } from "../../codec/kv-shape.ts";
import { headDimOf, kvDimOf, type ModelConfig, qDimOf } from "./config.ts";
import { softmaxF32, swigluF32 } from "./f32-math.ts";
import { ATT_SEQ_INTS, ATT_SEQS, attentionScratchBytes, attentionStride, fitsWithRoom, groupBudget, LayerGroup, planEvenGroups } from "./layer-group.ts";
import type { KernelExports } from "./kernel-exports.ts";
import { type KernelOptions, kernelModule } from "./matmul.ts";
import type { Matrix } from "./packed.ts";
import { LoadProgress } from "./load-progress.ts";
import { validateWeights, weightsBytes, weightsDType, type Weights } from "./weights.ts";

/**
 * One sequence's share of a forward pass: `tokens` sit at positions
 * startPos .. startPos + tokens.length - 1, and position p's K/V live in block
 * blockTable[floor(p / B)], slot p mod B. Positions before startPos must already be in the pool.
 */
export interface SeqChunk {
  blockTable: ArrayLike<number>;
  startPos: number;
  tokens: ArrayLike<number>;
}

// f16 bits -> value. The pool's Float16Array is ~8x slower to read than this table on Bun, and
// the table is exact, so attention reads the slab as Uint16 through it.
const F16_TABLE: Float32Array = (() => {
  const bits = new Uint16Array(65536);
  for (let i = 0; i < 65536; i++) bits[i] = i;
  return new Float32Array(new Float16Array(bits.buffer));
})();

/** Where a share of a KV pool's layers lives inside a shared buffer (one of KvPool's `segments`). */
export type KvSlab = KvSegmentRoom;

/** A KV pool's size: tokens a block, blocks (what an engine builds over the model). */
export interface KvPoolSize {
  blockTokens: number;
  numBlocks: number;
}

/** Options of a Transformer: the kernels' and how much one kernel memory may place. */
export interface TransformerOptions extends KernelOptions {
  /**
   * Bytes of weights one kernel memory may place (default: a wasm32 memory less the kernels'
   * room); a model past it is cut into layer groups (layer-group.ts). Tests lower it to run
   * several groups on a small model.
   */
  groupBytes?: number;
  /**
   * The KV pool the caller will ask kvSlab for: a model cut into groups keeps each layer's share
   * of it free beside the layer's weights, so the pool fits in the kernel memories and attention
   * reads it in place (a share too big for any memory is not kept: that pool goes outside).
   */
  kvPool?: KvPoolSize;
  /** Where the line of a placement longer than a second goes (default stderr: LoadProgress). */
  progress?: (line: string) => void;
}

/** What `Transformer.profile` times, index for index. */
export const FORWARD_PHASES = ["embed", "rmsnorm", "matmul", "bias", "rope", "kvWrite", "attention", "residual", "swiglu"] as const;
const P_EMBED = 0;
const P_NORM = 1;
const P_MATMUL = 2;
const P_BIAS = 3;
const P_ROPE = 4;
const P_KV = 5;
const P_ATT = 6;
const P_RESID = 7;
const P_SWIGLU = 8;

/** Adds the milliseconds since t to prof[phase]; returns now. */
function lap(prof: Float64Array, phase: number, t: number): number {
  const now = performance.now();
  prof[phase]! += now - t;
  return now;
}

/** Query rows of one sequence that share each decoded K/V vector in prefill attention. */
const ATT_TILE = 16;

/**
 * A llama2.c-style decoder whose KV cache is a paged KvPool.
 *
 * Every position's K and V are written to the pool as f16 and attention reads them back from
 * there, even for the positions computed in the same call. So the logits depend only on the
 * token sequence: the same whether a prompt is prefilled in one chunk or several, alone or
 * batched, or its blocks were computed by another engine and imported.
 */
export class Transformer {
  readonly cfg: ModelConfig;
  /** Projection biases (Qwen2), read in JS: stacked over every layer. */
  private readonly biases: { bq: Float32Array; bk: Float32Array; bv: Float32Array } | null;
  /** Threads asked for (the room each memory keeps for attention scratch is per thread). */
  private readonly threadsAsked: number;
  private readonly dtypeName: string;
  private readonly headDim: number;
  /** nHeads * headDim: equal to dim unless the model gives its own head_dim. */
  private readonly qDim: number;
  private readonly kvDim: number;
  private readonly kvMul: number;
  private readonly att: Float32Array;
  /** f32, so each `+=` rounds as the kernel's add. */
  private readonly acc: Float32Array;
  private readonly kvec: Float32Array;
  /**
   * The kernel memories holding the weights, in layer order (one unless the model outgrows a
   * wasm32 memory: layer-group.ts), and the group each layer's weights are in.
   */
  private readonly groups: readonly LayerGroup[];
  private readonly groupOfLayer: readonly LayerGroup[];
  private readonly embedGroup: LayerGroup;
  private readonly classifierGroup: LayerGroup;
  /** The group whose memory holds the residual stream x now: every method below works on it. */
  private g: LayerGroup;
  /**
   * When set (FORWARD_PHASES.length long), forward adds each phase's milliseconds into it: the
   * benchmark's profile. Null in service: then timing costs one branch per phase.
   */
  profile: Float64Array | null = null;
  /** When the phase being timed began (profiling only). */
  private lapT = 0;

  private rowSeq = new Int32Array(0);
  private lastRow = new Int32Array(0);
  /** Per sequence, its first block's place among the batch's K/V copies (a pool outside kernel memory). */
  private seqBase = new Int32Array(0);
  /** Blocks of a sequence as long as the model allows (the pool's B is fixed per forward). */
  private maxBlocks = 0;
  private readonly bitsOf = new WeakMap<KvSegment, Uint16Array>();
  /** The rooms kvSlab gave, by first layer and offset (slabKey). */
  private readonly slabs = new Map<string, Uint8Array>();

  constructor(cfg: ModelConfig, weights: Weights<Matrix>, opts: TransformerOptions = {}) {
    validateWeights(cfg, weights);
    this.cfg = cfg;
    this.headDim = headDimOf(cfg);
    this.qDim = qDimOf(cfg);
    this.kvDim = kvDimOf(cfg);
    this.kvMul = cfg.nHeads / cfg.nKvHeads;
    this.dtypeName = weightsDType(weights);
    this.biases = weights.bq ? { bq: weights.bq, bk: weights.bk!, bv: weights.bv! } : null;
    // Without the kernels nothing is placed, so there is nothing to cut.
    const simd = opts.simd !== false && kernelModule() !== null;
    const plans = simd
      ? planEvenGroups(cfg, weights, opts.groupBytes ?? groupBudget(cfg, opts.threads ?? 1), kvLayerBytes(cfg, opts.kvPool))
      : [{ first: 0, end: cfg.nLayers, embedding: true, classifier: true }];
    this.threadsAsked = opts.threads ?? 1;
    // Placing a big model's weights takes a while: say so, as reading and converting them do.
    const placing = new LoadProgress(cfg.name, weightsBytes(weights), opts.progress, undefined, ["placing", "placed"]);
    this.groups = plans.map((p) => new LayerGroup(cfg, weights, p, simd ? { ...opts, placing } : opts));
    placing.finish();
    this.groupOfLayer = Array.from({ length: cfg.nLayers }, (_, l) => this.groups.find((g) => g.holds(l))!);
    this.embedGroup = this.groups.find((g) => g.w.tokenEmbedding !== null)!;
    this.classifierGroup = this.groups.find((g) => g.w.wcls !== null)!;
    this.g = this.groups[0]!;
    this.att = new Float32Array(ATT_TILE * this.kvMul * cfg.maxSeqLen);
    this.acc = new Float32Array(ATT_TILE * this.kvMul * this.headDim);
    this.kvec = new Float32Array(this.headDim);
  }

  /** The weights' dtype in memory. */
  get dtype(): string {
    return this.dtypeName;
  }

  /** What runs the matmuls: "wasm-simd", or "plain-js (why)" (MatmulKernel.kernels). */
  get kernels(): string {
    return this.groups[0]!.mm.kernels;
  }

  /** Kernel memories the weights are spread over (layer-group.ts): 1 unless past a wasm32 memory. */
  get memories(): number {
    return this.groups.length;
  }

  /** Whether every kernel memory is on 2 MiB pages (MatmulKernel.hugePages). */
  get hugePages(): boolean {
    return this.groups.every((g) => g.mm.hugePages);
  }

  /** Bytes of kernel memory taken for good over every group: weights, slabs, scratch (MatmulKernel.usedBytes). */
  get kernelBytes(): number {
    return this.groups.reduce((n, g) => n + g.mm.usedBytes, 0);
  }

  /** Threads the matmuls run on. */
  get threads(): number {
    return this.groups[0]!.mm.threadCount;
  }

  /** Matmul calls shared with helper threads so far. */
  get splitCalls(): number {
    return this.groups.reduce((n, g) => n + g.mm.splitCalls, 0);
  }

  /** Settles when every matmul thread runs; forward works before, on fewer threads. */
  ready(): Promise<void> {
    return Promise.all(this.groups.map((g) => g.mm.ready())).then(() => {});
  }

  /**
   * Room for a KV pool of `bytes` in the kernel memories, where attention reads the blocks in
   * place instead of copying each layer's: each memory holding layers gets their share of every
   * block (one segment, all of it, for a model in one memory). Build the pool with these as its
   * segments. Null on the fallback, or when a memory (wasm32: 4 GiB) cannot hold its share with
   * room left for the forwards; a pool elsewhere still works.
   */
  kvSlab(bytes: number): KvSlab[] | null {
    const L = this.cfg.nLayers;
    if (!(Number.isInteger(bytes / L) && bytes > 0)) assert.fail(`a KV pool of ${bytes} bytes is not a whole share for each of ${L} layers`);
    const holders = this.groups.filter((g) => g.end > g.first);
    const share = (g: LayerGroup) => (bytes / L) * (g.end - g.first);
    // Every memory is checked before any gives room: a memory's room is never handed back. Each
    // is weighed by what it placed and gave before, not by what it holds now: what the forwards
    // have taken since (the RoPE tables, activations) is inside the room already.
    if (!holders.every((g) => fitsWithRoom(this.cfg, this.threadsAsked, g.placedBytes + g.kvBytes, share(g)))) return null;
    const rooms: KvSlab[] = [];
    for (const g of holders) {
      let a: Uint8Array | null = null;
      try {
        a = g.mm.allocZeroed(share(g));
      } catch (e) {
        if (!(e instanceof RangeError)) throw e;
      }
      if (a === null) return null;
      g.kvBytes += share(g);
      this.slabs.set(slabKey(g.first, a.byteOffset), a);
      rooms.push({ slab: a.buffer as SharedArrayBuffer, slabOffset: a.byteOffset, firstLayer: g.first, nLayers: g.end - g.first });
    }
    return rooms;
  }

  /** A KV pool over the rooms kvSlab gave (another thread's pool's twin): each segment's first layer and offset. */
  kvPoolAt(shape: KvShape, numBlocks: number, rooms: readonly { firstLayer: number; slabOffset: number }[]): KvPool {
    const segments = rooms.map((r) => {
      const a = this.slabs.get(slabKey(r.firstLayer, r.slabOffset));
      if (a === undefined) assert.fail(`no KV slab was given for layer ${r.firstLayer} at ${r.slabOffset}`);
      const g = this.groupOfLayer[r.firstLayer]!;
      return { slab: a.buffer as SharedArrayBuffer, slabOffset: r.slabOffset, firstLayer: r.firstLayer, nLayers: g.end - g.first };
    });
    return new KvPool(shape, numBlocks, { segments });
  }

  /** A KV pool whose blocks are in the kernel memories when they fit there (see kvSlab), else in a slab of its own. */
  kvPool(shape: KvShape, numBlocks: number): KvPool {
    const rooms = this.kvSlab(numBlocks * blockPayloadBytes(shape));
    return new KvPool(shape, numBlocks, rooms === null ? {} : { segments: rooms });
  }

  /** Stops the matmul helper threads (the model still runs, on the caller alone). */
  close(): void {
    for (const g of this.groups) g.mm.close();
  }

  /**
   * Runs every chunk's tokens through the model, writing their K/V into `pool` (and raising
   * block fills), and puts the logits of each chunk's last position in
   * out[i*vocab .. (i+1)*vocab). All rows of the batch share one pass over each weight matrix.
   */
  forward(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): void {
    const rows = this.checkBatch(pool, batch, out);
    if (rows === 0) return;
    const B = pool.shape.blockTokens;
    if (this.maxBlocks < Math.ceil(this.cfg.maxSeqLen / B)) {
      // A pool of smaller blocks than the last: the tables are laid out anew.
      this.maxBlocks = Math.ceil(this.cfg.maxSeqLen / B);
      for (const g of this.groups) g.seqCap = 0;
    }
    this.reserve(rows, batch.length);
    if (this.profile) this.lapT = performance.now();
    this.embed(batch);
    this.lap(P_EMBED);
    let inPlace = false;
    for (let l = 0; l < this.cfg.nLayers; l++) {
      if (l === 0 || this.groupOfLayer[l] !== this.g) {
        this.enter(this.groupOfLayer[l]!, rows);
        inPlace = this.g.mm.exports !== null && this.attentionTables(pool, batch, rows);
      }
      this.attentionBlock(pool, batch, l, rows, inPlace);
      this.feedForwardBlock(l, rows);
    }
    this.enter(this.classifierGroup, rows);
    this.logits(batch.length, rows, out);
    raiseFills(pool, batch, this.g.rowPos, this.rowSeq, rows);
  }

  /** Makes g the group in use, handing it the residual stream x when it was in another memory. */
  private enter(g: LayerGroup, rows: number): void {
    if (g === this.g) return;
    const n = rows * this.cfg.dim;
    g.x.set(this.g.x.subarray(0, n));
    this.leave(g);
  }

  /**
   * Makes g the group in use, resting the helpers of the one left: they would spin out their 2 ms
   * beside g's, three threads on two cores at every switch (AMD EPYC, 2 threads, 1B Q4_K_M cut
   * into 3 groups by GROUP_BYTES=3e8: decode 46.8 -> 39.9 ms a token, bench/decode-ab.ts; an
   * 8B's 2 groups gain within the noise).
   */
  private leave(g: LayerGroup): void {
    if (g !== this.g) this.g.mm.rest();
    this.g = g;
  }

  /** The batch's rows after checking it fits the model, the pool and `out`; 0 for an empty batch. */
  private checkBatch(pool: KvPool, batch: readonly SeqChunk[], out: Float32Array): number {
    const cfg = this.cfg;
    const { nLayers, vocabSize } = cfg;
    const B = pool.shape.blockTokens;
    // Checks are written `if (!ok) assert.fail(...)` so the messages are only built on failure:
    // forward runs once per token and must not allocate in steady state.
    const ps = pool.shape;
    if (ps.nLayers !== nLayers || ps.nKvHeads !== cfg.nKvHeads || ps.headDim !== this.headDim) {
      assert.fail(`pool shape L=${ps.nLayers} H=${ps.nKvHeads} D=${ps.headDim} does not fit model L=${nLayers} H=${cfg.nKvHeads} D=${this.headDim}`);
    }
    const nSeq = batch.length;
    if (out.length < nSeq * vocabSize) assert.fail(`out has ${out.length} floats, want ${nSeq * vocabSize}`);
    let rows = 0;
    for (let s = 0; s < nSeq; s++) {
      const c = batch[s]!;
      const n = c.tokens.length;
      if (n < 1) assert.fail(`chunk ${s} has no tokens`);
      if (!(Number.isInteger(c.startPos) && c.startPos >= 0)) assert.fail(`chunk ${s} startPos ${c.startPos}`);
      const end = c.startPos + n;
      if (end > cfg.maxSeqLen) assert.fail(`chunk ${s} ends at position ${end}, past maxSeqLen ${cfg.maxSeqLen}`);
      const needBlocks = Math.ceil(end / B);
      if (c.blockTable.length < needBlocks) assert.fail(`chunk ${s} needs ${needBlocks} blocks, table has ${c.blockTable.length}`);
      for (let b = 0; b < needBlocks; b++) {
        const id = c.blockTable[b]!;
        if (!(Number.isInteger(id) && id >= 0 && id < pool.total)) assert.fail(`chunk ${s} block ${b} id ${id} outside pool`);
      }
      for (let t = 0; t < n; t++) {
        const tok = c.tokens[t]!;
        if (!(Number.isInteger(tok) && tok >= 0 && tok < vocabSize)) assert.fail(`chunk ${s} token ${tok} outside vocab ${vocabSize}`);
      }
      rows += n;
    }
    return rows;
  }

  /** Each row's position, sequence and embedding (into x); each sequence's last row. */
  private embed(batch: readonly SeqChunk[]): void {
    // x starts in the memory of layer 0; every group's kernels read the rows' positions.
    this.leave(this.groupOfLayer[0] ?? this.classifierGroup);
    const { x, rowPos } = this.g;
    const { rowSeq, lastRow } = this;
    const { mm, w } = this.embedGroup;
    const dim = this.cfg.dim;
    let r = 0;
    for (let s = 0; s < batch.length; s++) {
      const c = batch[s]!;
      for (let t = 0; t < c.tokens.length; t++, r++) {
        rowPos[r] = c.startPos + t;
        rowSeq[r] = s;
        // The embedding's copy is in the kernels' strip layout: its rows are read through mm.
        mm.rowInto(w.tokenEmbedding!, c.tokens[t]! * dim, dim, x, r * dim);
      }
      lastRow[s] = r - 1;
    }
    for (const g of this.groups) if (g !== this.g) g.rowPos.set(rowPos.subarray(0, r));
  }

  /** Layer l's attention half: norm, q/k/v, RoPE, the K/V store, attention, wo, residual. */
  private attentionBlock(pool: KvPool, batch: readonly SeqChunk[], l: number, rows: number, inPlace: boolean): void {
    const { x, xb, q, k, v, w, mm } = this.g;
    const { dim } = this.cfg;
    const { qDim, kvDim, biases } = this;
    const ex = mm.exports;
    const B = pool.shape.blockTokens;
    // Layer l's weights sit at its place among its group's layers.
    const gl = l - this.g.first;
    this.rmsnorm(xb, x, w.rmsAtt, gl * dim, rows);
    this.lap(P_NORM);
    // One dispatch for q, k and v: it hands the helper threads their share once.
    mm.queue(q, xb, w.wq, gl * qDim * dim, rows, dim, qDim);
    mm.queue(k, xb, w.wk, gl * kvDim * dim, rows, dim, kvDim);
    mm.queue(v, xb, w.wv, gl * kvDim * dim, rows, dim, kvDim);
    mm.flush();
    this.lap(P_MATMUL);
    if (biases !== null) {
      addBias(q, biases.bq, l * qDim, rows, qDim);
      addBias(k, biases.bk, l * kvDim, rows, kvDim);
      addBias(v, biases.bv, l * kvDim, rows, kvDim);
      this.lap(P_BIAS);
    }
    this.rope(rows);
    this.lap(P_ROPE);
    // Store every row's K/V before any attention, so rows of this call see each other
    // exactly as later calls will: through the f16 slab.
    // The pool's segment holding layer l, and l's place among its layers.
    const seg = pool.segmentOf(l);
    const sl = l - seg.firstLayer;
    if (inPlace) ex!.store_kv(mm.addressOf(this.g.kvDst), sl * 2 * B * kvDim * 2, B * kvDim * 2, mm.addressOf(k), mm.addressOf(v), rows, kvDim);
    else if (ex !== null) this.storeKvSimd(ex, this.bitsFor(seg), seg.blockElems, B, sl, batch, rows);
    else storeKv(seg.data, k, v, this.g.rowPos, this.rowSeq, batch, seg.blockElems, B, sl, kvDim, rows);
    this.lap(P_KV);
    if (ex !== null) this.attentionSimd(seg, sl, B, batch, inPlace);
    else this.attention(this.bitsFor(seg), seg.blockElems, B, sl, batch, rows);
    this.lap(P_ATT);
    this.addProjection(xb, w.wo, gl * dim * qDim, qDim, rows);
  }

  /** Layer l's feed-forward half: norm, w1/w3, SwiGLU, w2, residual. */
  private feedForwardBlock(l: number, rows: number): void {
    const { x, xb, hb, hb2, w, mm } = this.g;
    const { dim, hiddenDim: hid } = this.cfg;
    const ex = mm.exports;
    const gl = l - this.g.first;
    this.rmsnorm(xb, x, w.rmsFfn, gl * dim, rows);
    this.lap(P_NORM);
    mm.queue(hb, xb, w.w1, gl * hid * dim, rows, dim, hid);
    mm.queue(hb2, xb, w.w3, gl * hid * dim, rows, dim, hid);
    mm.flush();
    this.lap(P_MATMUL);
    if (ex !== null) mm.swiglu(hb, hb2, rows * hid);
    else swigluF32(hb, hb2, rows * hid);
    this.lap(P_SWIGLU);
    this.addProjection(hb, w.w2, gl * dim * hid, hid, rows);
  }

  /** Both halves' end: the residual stream x gains src (rows of n) projected back to dim by m at wOff. */
  private addProjection(src: Float32Array, m: Matrix, wOff: number, n: number, rows: number): void {
    const dim = this.cfg.dim;
    const g = this.g;
    g.mm.matmul(g.xb2, src, m, wOff, rows, n, dim);
    this.lap(P_MATMUL);
    this.addInto(g.x, g.xb2, rows * dim);
    this.lap(P_RESID);
  }

  /** The final norm and the classifier, for each sequence's last row only. */
  private logits(nSeq: number, rows: number, out: Float32Array): void {
    const { x, xb, lastX, w, mm } = this.g;
    const { lastRow } = this;
    const { dim, vocabSize } = this.cfg;
    // One row per sequence (decode): the last rows are x's rows as they stand.
    if (rows !== nSeq) {
      for (let s = 0; s < nSeq; s++) {
        const src = lastRow[s]! * dim;
        for (let i = 0; i < dim; i++) xb[s * dim + i] = x[src + i]!;
      }
    }
    this.rmsnorm(lastX, rows === nSeq ? x : xb, w.rmsFinal!, 0, nSeq);
    this.lap(P_NORM);
    mm.matmul(out, lastX, w.wcls!, 0, nSeq, dim, vocabSize);
    this.lap(P_MATMUL);
  }

  /** Time since the last lap into `phase`, when profiling (one branch otherwise). */
  private lap(phase: number): void {
    if (this.profile !== null) this.lapT = lap(this.profile, phase, this.lapT);
  }

  private reserve(rows: number, nSeq: number): void {
    for (const g of this.groups) g.reserve(this.cfg, this.qDim, this.kvDim, rows, nSeq, this.maxBlocks);
    if (rows > this.rowSeq.length) this.rowSeq = new Int32Array(Math.max(rows, this.rowSeq.length * 2));
    if (nSeq > this.lastRow.length) this.lastRow = new Int32Array(Math.max(nSeq, this.lastRow.length * 2));
    if (nSeq > this.seqBase.length) this.seqBase = new Int32Array(Math.max(nSeq, this.seqBase.length * 2));
  }

  /** x += y over n floats (both in the kernel's memory on the SIMD path): the same bits either way. */
  private addInto(x: Float32Array, y: Float32Array, n: number): void {
    const mm = this.g.mm;
    const ex = mm.exports;
    if (ex !== null) ex.add_into(mm.addressOf(x), mm.addressOf(y), n);
    else for (let i = 0; i < n; i++) x[i]! += y[i]!;
  }

  /**
   * storeKv through the kernel for a slab outside the kernel memory: every row's K and V rounded
   * to f16 in kernel memory (to_f16 rounds as Float16Array does), then moved into the slab as bit
   * patterns. (A slab inside it is written in place by the kernel's store_kv.)
   */
  private storeKvSimd(ex: KernelExports, bits: Uint16Array, blockElems: number, B: number, l: number, batch: readonly SeqChunk[], rows: number): void {
    const { kvDim, rowSeq } = this;
    const { rowPos, kvHalf16: half, mm } = this.g;
    const at = mm.addressOf(this.g.kvHalf!);
    const n = rows * kvDim;
    ex.to_f16(at, mm.addressOf(this.g.k), n);
    ex.to_f16(at + 2 * n, mm.addressOf(this.g.v), n);
    for (let r = 0; r < rows; r++) {
      const ko = kSlotOf(batch[rowSeq[r]!]!.blockTable, rowPos[r]!, blockElems, B, l, kvDim);
      const vo = ko + B * kvDim;
      const src = r * kvDim;
      for (let i = 0; i < kvDim; i++) {
        bits[ko + i] = half[src + i]!;
        bits[vo + i] = half[n + src + i]!;
      }
    }
  }

  /** seg's f16 as bit patterns (F16_TABLE's index), made once per segment: a forward allocates nothing. */
  private bitsFor(seg: KvSegment): Uint16Array {
    let b = this.bitsOf.get(seg);
    if (b === undefined) {
      const d = seg.data;
      b = new Uint16Array(d.buffer, d.byteOffset, d.length);
      this.bitsOf.set(seg, b);
    }
    return b;
  }

  /** rmsnorm (below) of rows of x into o, by the kernel when there is one: the same bits. */
  private rmsnorm(o: Float32Array, x: Float32Array, g: Float32Array, gOff: number, rows: number): void {
    const mm = this.g.mm;
    const ex = mm.exports;
    const { dim, normEps } = this.cfg;
    if (ex !== null) ex.rmsnorm(mm.addressOf(o), mm.addressOf(x), mm.addressOf(g) + 4 * gOff, rows, dim, normEps);
    else rmsnorm(o, x, g, gOff, rows, dim, normEps);
  }

  /** RoPE of every row's q and k at its position, by the kernel when there is one (the same bits as this JS). */
  private rope(rows: number): void {
    const { q, k, rowPos, ropeCos, ropeSin, mm } = this.g;
    const ex = mm.exports;
    if (ex !== null) {
      ex.rope(mm.addressOf(q), mm.addressOf(k), mm.addressOf(rowPos), mm.addressOf(ropeCos), mm.addressOf(ropeSin), rows, this.qDim, this.kvDim, this.headDim);
      return;
    }
    const dim = this.qDim;
    const kvDim = this.kvDim;
    const hd = this.headDim;
    const half = hd / 2;
    for (let r = 0; r < rows; r++) {
      const base = rowPos[r]! * half;
      const qo = r * dim;
      for (let i = 0; i < dim; i += 2) {
        const t = base + ((i % hd) >> 1);
        const c = ropeCos[t]!;
        const s = ropeSin[t]!;
        const a = q[qo + i]!;
        const b = q[qo + i + 1]!;
        q[qo + i] = a * c - b * s;
        q[qo + i + 1] = a * s + b * c;
      }
      const ko = r * kvDim;
      for (let i = 0; i < kvDim; i += 2) {
        const t = base + ((i % hd) >> 1);
        const c = ropeCos[t]!;
        const s = ropeSin[t]!;
        const a = k[ko + i]!;
        const b = k[ko + i + 1]!;
        k[ko + i] = a * c - b * s;
        k[ko + i + 1] = a * s + b * c;
      }
    }
  }

  /**
   * Fills the attention kernel's block tables for this forward, for the group in use: each
   * sequence's blocks read in place when the pool's segment of the group's layers lives in its
   * kernel memory (returns true; then each row's K/V slot goes to kvDst too, for store_kv), else
   * the addresses of their copies in kvScratch, which attentionSimd fills per layer.
   */
  private attentionTables(pool: KvPool, batch: readonly SeqChunk[], rows: number): boolean {
    const B = pool.shape.blockTokens;
    const mb = this.maxBlocks;
    const g = this.g;
    const tables = g.attTables;
    const seg = pool.segmentOf(g.first);
    const covers = seg.firstLayer <= g.first && g.end <= seg.firstLayer + seg.nLayers;
    const slabAt = covers ? g.mm.addressOf(seg.bytes) : -1;
    const layerBytes = 2 * B * this.kvDim * 2;
    if (slabAt < 0) {
      // The copies sit back to back, as many as the batch's sequences have blocks now (sized by
      // the model's whole context, 8 sequences of a 128K-context model would want 4 GiB).
      let blocks = 0;
      for (let s = 0; s < batch.length; s++) {
        const c = batch[s]!;
        this.seqBase[s] = blocks;
        blocks += Math.ceil((c.startPos + c.tokens.length) / B);
      }
      const need = blocks * layerBytes;
      if (g.kvScratch === null || g.kvScratch.byteLength < need) g.kvScratch = g.mm.allocBytes(Math.max(need, 2 * (g.kvScratch?.byteLength ?? 0)))!;
    }
    const kvAt = slabAt < 0 ? g.mm.addressOf(g.kvScratch!) : 0;
    for (let s = 0; s < batch.length; s++) {
      const c = batch[s]!;
      const nb = Math.ceil((c.startPos + c.tokens.length) / B);
      for (let b = 0; b < nb; b++) tables[s * mb + b] = slabAt >= 0 ? slabAt + c.blockTable[b]! * seg.blockBytes : kvAt + (this.seqBase[s]! + b) * layerBytes;
    }
    if (slabAt < 0) return false;
    const { rowPos, kvDst } = g;
    const rowSeq = this.rowSeq;
    for (let r = 0; r < rows; r++) kvDst[r] = slabAt + 2 * kSlotOf(batch[rowSeq[r]!]!.blockTable, rowPos[r]!, seg.blockElems, B, 0, this.kvDim);
    return true;
  }

  /**
   * Attention in the SIMD kernel (kernels/assembly/attention.ts states its order), in pieces
   * shared with the helper threads as the matmuls are: a decoding sequence whole (its heads read
   * the blocks together), a prefill one per KV head. The blocks of layer sl of the pool's segment
   * `seg` are read through attentionTables': in place, or from this layer's copy made here (one per block). Each
   * row's result depends only on its query and the cached K/V, so chunking, batching and threads
   * never change a bit.
   */
  private attentionSimd(seg: KvSegment, sl: number, B: number, batch: readonly SeqChunk[], inPlace: boolean): void {
    const g = this.g;
    const mm = g.mm;
    const layerBytes = 2 * B * this.kvDim * 2;
    const mb = this.maxBlocks;
    const p = g.attParams;
    const rowBytes = this.qDim * 4;
    const qAt = mm.addressOf(g.q);
    const xbAt = mm.addressOf(g.xb);
    const tablesAt = mm.addressOf(g.attTables);
    const nKv = this.cfg.nKvHeads;
    const pieces = g.attPieces;
    const streamPer = decodeHeadsPerPiece(nKv, batch.length, mm.threadCount);
    let nPieces = 0;
    let macs = 0;
    for (let s = 0, r = 0; s < batch.length; s++) {
      const c = batch[s]!;
      const nr = c.tokens.length;
      const n = c.startPos + nr;
      if (!inPlace) {
        const kvs = g.kvScratch!;
        const src = seg.bytes;
        for (let b = 0, nb = Math.ceil(n / B); b < nb; b++) {
          const from = c.blockTable[b]! * seg.blockBytes + sl * layerBytes;
          kvs.set(src.subarray(from, from + layerBytes), (this.seqBase[s]! + b) * layerBytes);
        }
      }
      const o = ATT_SEQS + s * ATT_SEQ_INTS;
      p[o] = xbAt + r * rowBytes;
      p[o + 1] = qAt + r * rowBytes;
      p[o + 2] = tablesAt + s * mb * 4;
      p[o + 3] = c.startPos;
      p[o + 4] = nr;
      // A prefill sequence goes KV head by KV head; a decoding one (streamed: attendStream) in
      // ranges of KV heads, so that a small batch still gives every thread a share.
      const per = nr * this.kvMul < 4 ? streamPer : 1;
      for (let g = 0; g < nKv; g += per, nPieces++) {
        pieces[3 * nPieces] = s;
        pieces[3 * nPieces + 1] = g;
        pieces[3 * nPieces + 2] = Math.min(nKv, g + per);
      }
      macs += 2 * nr * n * this.qDim;
      r += nr;
    }
    p[0] = mm.addressOf(pieces);
    p[1] = B;
    p[2] = this.cfg.nKvHeads;
    p[3] = this.kvMul;
    p[4] = this.headDim;
    p[5] = this.qDim;
    p[6] = inPlace ? sl * layerBytes : 0;
    p[7] = attentionStride(this.cfg);
    p[8] = nPieces;
    const scratchBytes = attentionScratchBytes(this.cfg);
    // An attention multiply-add (f16 widening, softmax) costs about four of a matmul's.
    mm.attend(mm.addressOf(p), nPieces, 4 * macs, scratchBytes);
  }

  /**
   * The attention kernel's arithmetic in plain JS (kernels/assembly/attention.ts states the
   * order; every operation rounded to f32), for engines without WebAssembly SIMD: the same bits.
   * Causal grouped-query attention of every row over positions 0..pos, K/V read from the slab;
   * result in xb. Each f16 K/V vector is decoded once and used by every query that needs it:
   * the kvMul heads sharing its KV head and, in prefill, up to ATT_TILE consecutive rows of the
   * same sequence. Tiling never changes a bit: each score and each output is its own sum.
   */
  // Long by design: one loop nest, scores then softmax then values per tile, as the kernel's.
  private attention(bits: Uint16Array, blockElems: number, B: number, l: number, batch: readonly SeqChunk[], rows: number): void {
    const { q, xb, rowPos } = this.g;
    const { att, acc, kvec, rowSeq } = this;
    const f = Math.fround;
    const lut = F16_TABLE;
    // Row stride of q and of the attention output in xb.
    const dim = this.qDim;
    const maxSeq = this.cfg.maxSeqLen;
    const hd = this.headDim;
    const hd4 = hd - (hd % 4);
    const kvDim = this.kvDim;
    const kvMul = this.kvMul;
    const nKv = this.cfg.nKvHeads;
    const sqrtHd = f(Math.sqrt(hd));
    const kLayer = 2 * l * B;
    const vLayer = kLayer + B;
    for (let r = 0; r < rows; ) {
      // A tile: consecutive rows of one chunk, so positions rise by one per row.
      const seq = rowSeq[r]!;
      let rEnd = r + 1;
      while (rEnd < rows && rEnd - r < ATT_TILE && rowSeq[rEnd] === seq) rEnd++;
      const nr = rEnd - r;
      const table = batch[seq]!.blockTable;
      const firstPos = rowPos[r]!;
      const n = rowPos[rEnd - 1]! + 1;
      for (let g = 0; g < nKv; g++) {
        const headOff = g * hd;
        const qHead = r * dim + g * kvMul * hd;
        for (let t0 = 0, b = 0; t0 < n; t0 += B, b++) {
          const blockBase = table[b]! * blockElems + headOff;
          const m = Math.min(B, n - t0);
          for (let slot = 0; slot < m; slot++) {
            const t = t0 + slot;
            const ko = blockBase + (kLayer + slot) * kvDim;
            for (let i = 0; i < hd; i++) kvec[i] = lut[bits[ko + i]!]!;
            for (let j = t > firstPos ? t - firstPos : 0; j < nr; j++) {
              for (let h = 0; h < kvMul; h++) {
                const qo = qHead + j * dim + h * hd;
                let s0 = 0;
                let s1 = 0;
                let s2 = 0;
                let s3 = 0;
                for (let i = 0; i < hd4; i += 4) {
                  s0 = f(s0 + f(q[qo + i]! * kvec[i]!));
                  s1 = f(s1 + f(q[qo + i + 1]! * kvec[i + 1]!));
                  s2 = f(s2 + f(q[qo + i + 2]! * kvec[i + 2]!));
                  s3 = f(s3 + f(q[qo + i + 3]! * kvec[i + 3]!));
                }
                let s = f(f(s0 + s1) + f(s2 + s3));
                for (let i = hd4; i < hd; i++) s = f(s + f(q[qo + i]! * kvec[i]!));
                att[(j * kvMul + h) * maxSeq + t] = s / sqrtHd;
              }
            }
          }
        }
        for (let j = 0; j < nr; j++) for (let h = 0; h < kvMul; h++) softmaxF32(att, (j * kvMul + h) * maxSeq, firstPos + j + 1);
        acc.fill(0, 0, nr * kvMul * hd);
        for (let t0 = 0, b = 0; t0 < n; t0 += B, b++) {
          const blockBase = table[b]! * blockElems + headOff;
          const m = Math.min(B, n - t0);
          for (let slot = 0; slot < m; slot++) {
            const t = t0 + slot;
            const vo = blockBase + (vLayer + slot) * kvDim;
            for (let i = 0; i < hd; i++) kvec[i] = lut[bits[vo + i]!]!;
            for (let j = t > firstPos ? t - firstPos : 0; j < nr; j++) {
              for (let h = 0; h < kvMul; h++) {
                const a = att[(j * kvMul + h) * maxSeq + t]!;
                const ao = (j * kvMul + h) * hd;
                for (let i = 0; i < hd; i++) acc[ao + i]! += f(a * kvec[i]!);
              }
            }
          }
        }
        for (let j = 0; j < nr; j++) {
          const src = j * kvMul * hd;
          const dst = qHead + j * dim;
          for (let i = 0, k = kvMul * hd; i < k; i++) xb[dst + i] = acc[src + i]!;
        }
      }
      r = rEnd;
    }
  }
}

/** Each row's block filled up to its position (fills only grow: a shorter rewrite never lowers one). */
function raiseFills(pool: KvPool, batch: readonly SeqChunk[], rowPos: Int32Array, rowSeq: Int32Array, rows: number): void {
  const B = pool.shape.blockTokens;
  for (let r = 0; r < rows; r++) {
    const pos = rowPos[r]!;
    const blk = batch[rowSeq[r]!]!.blockTable[(pos / B) | 0]!;
    const fill = (pos % B) + 1;
    if (pool.fillOf(blk) < fill) pool.setFill(blk, fill);
  }
}

/** Element index in the slab of position pos's K vector in layer l (its V follows B * kvDim later). */
function kSlotOf(table: ArrayLike<number>, pos: number, blockElems: number, B: number, l: number, kvDim: number): number {
  return table[(pos / B) | 0]! * blockElems + (2 * l * B + (pos % B)) * kvDim;
}

/** Row r's K and V (f32, kvDim each) into its position's slot of layer l in the slab, as f16. */
function storeKv(
  data: Float16Array,
  k: Float32Array,
  v: Float32Array,
  rowPos: Int32Array,
  rowSeq: Int32Array,
  batch: readonly SeqChunk[],
  blockElems: number,
  B: number,
  l: number,
  kvDim: number,
  rows: number,
): void {
  for (let r = 0; r < rows; r++) {
    const ko = kSlotOf(batch[rowSeq[r]!]!.blockTable, rowPos[r]!, blockElems, B, l, kvDim);
    const vo = ko + B * kvDim;
    const src = r * kvDim;
    for (let i = 0; i < kvDim; i++) {
      data[ko + i] = k[src + i]!;
      data[vo + i] = v[src + i]!;
    }
  }
}

/** x[r] += b for each row of width n. */
function addBias(x: Float32Array, b: Float32Array, bOff: number, rows: number, n: number): void {
  for (let r = 0; r < rows; r++) {
    const o = r * n;
    for (let i = 0; i < n; i++) x[o + i]! += b[bOff + i]!;
  }
}

/** o[r] = g * x[r] / rms(x[r]) for each row, as run.c (eps inside the root). */
function rmsnorm(o: Float32Array, x: Float32Array, g: Float32Array, gOff: number, rows: number, dim: number, eps: number): void {
  for (let r = 0; r < rows; r++) {
    const xo = r * dim;
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += x[xo + i]! * x[xo + i]!;
    const inv = 1 / Math.sqrt(ss / dim + eps);
    for (let i = 0; i < dim; i++) o[xo + i] = g[gOff + i]! * (inv * x[xo + i]!);
  }
}

/** A room kvSlab gave: its segment's first layer names the memory, the offset the place in it. */
function slabKey(firstLayer: number, slabOffset: number): string {
  return `${firstLayer}@${slabOffset}`;
}

/** Bytes of one layer's share of a KV pool of `pool` (0 for none): its blocks' K and V of that layer. */
function kvLayerBytes(cfg: ModelConfig, pool: KvPoolSize | undefined): number {
  if (pool === undefined) return 0;
  return pool.numBlocks * blockPayloadBytes({ blockTokens: pool.blockTokens, nLayers: 1, nKvHeads: cfg.nKvHeads, headDim: headDimOf(cfg) });
}
