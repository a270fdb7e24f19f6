import assert from "node:assert";
import { headDimOf, kvDimOf, type ModelConfig, qDimOf, ropeFrequencies } from "./config.ts";
import { ATTEND_JOB_BYTES } from "./kernel-exports.ts";
import { type KernelOptions, MAX_PLACED_BYTES, MatmulKernel } from "./matmul.ts";
import { dtypeOf, isStacked, type Matrix, matrixBytes, type SimpleMatrix } from "./packed.ts";
import { stripLayoutBytes } from "./strip-layout.ts";
import { matrixCols, type Weights } from "./weights.ts";

/**
 * A model in several kernel memories. A wasm32 memory holds 4 GiB, less the room the kernels'
 * activations take, so a model past that (an 8B Q8_0, a 3B F16) is cut into groups of
 * consecutive layers, each group one MatmulKernel: its own memory, its own helper threads, the
 * weights of its layers, the norms and RoPE tables they use, and a set of activations. The
 * residual stream x (rows x dim floats, a few KB a token) is copied from one group's memory to
 * the next where the layers cross; nothing else travels. The embedding sits with the first
 * layer (or with the classifier when the two are one matrix) and the classifier with the last.
 *
 * Every kernel computes the same bits wherever its operands live, so a model gives the same
 * logits in one group or many (test/model/layer-groups.test.ts holds that).
 */

/** Layer-stacked matrices: (L, rows, cols), cut by layer. */
const LAYER_MATRICES = ["wq", "wk", "wv", "wo", "w1", "w2", "w3"] as const;
type LayerMatrix = (typeof LAYER_MATRICES)[number];

/** What one group holds of the weights: its layers' matrices and norms; the ends where it has them. */
export interface GroupWeights extends Record<LayerMatrix, Matrix> {
  /** (its layers, dim) */
  rmsAtt: Float32Array;
  rmsFfn: Float32Array;
  tokenEmbedding: Matrix | null;
  wcls: Matrix | null;
  rmsFinal: Float32Array | null;
}

/** One group of the plan: layers first .. end - 1, and whether it holds the embedding and the classifier. */
export interface GroupPlan {
  first: number;
  end: number;
  embedding: boolean;
  classifier: boolean;
}

/** Bytes the kernels place for m in rows of `cols` (a stacked matrix's parts each on their own). */
function placedBytesOf(m: Matrix, cols: number): number {
  if (isStacked(m)) return m.parts.reduce((t, p) => t + placedBytesOf(p, cols), 0);
  return Math.ceil(stripLayoutBytes(dtypeOf(m), m.length / cols, cols) / 16) * 16;
}

/**
 * Bytes the kernels place for the embedding (0 when the classifier is the same matrix), each
 * layer (layers of one file may differ: a Q4_K_M keeps some in q6_k), the largest layer, and
 * the classifier.
 */
export function placedBytes(cfg: ModelConfig, w: Weights<Matrix>): { embedding: number; layers: number[]; layer: number; classifier: number } {
  const L = cfg.nLayers;
  const layers = Array.from({ length: L }, (_, l) =>
    LAYER_MATRICES.reduce((t, k) => t + placedBytesOf(layerSlice(w[k], matrixCols(cfg, k), L, l, l + 1), matrixCols(cfg, k)), 0),
  );
  return {
    embedding: w.wcls === w.tokenEmbedding ? 0 : placedBytesOf(w.tokenEmbedding, cfg.dim),
    layers,
    layer: Math.max(...layers),
    classifier: placedBytesOf(w.wcls, cfg.dim),
  };
}

/**
 * Consecutive groups whose placed weights each fit `budget` bytes: the embedding (unless the
 * classifier is the same matrix), the layers in order, then the classifier, each group taking
 * items while they fit. A layer counts `kvLayerBytes` more: its share of a KV pool the group is
 * to hold beside it (kvSlab). Throws when one item alone does not fit.
 */
export function planGroups(cfg: ModelConfig, w: Weights<Matrix>, budget: number, kvLayerBytes = 0): GroupPlan[] {
  return packGroups(groupItems(cfg, w, kvLayerBytes), w.wcls === w.tokenEmbedding, budget);
}

/**
 * planGroups' groups made as even as their number allows: packed to the smallest budget that
 * needs no more memories than `budget` does, so every memory keeps a share of what the weights
 * leave free (room for its layers' share of a KV pool) instead of the last one keeping it all.
 * A KV share that would not fit beside a layer is left out: that pool goes outside the memories.
 */
export function planEvenGroups(cfg: ModelConfig, w: Weights<Matrix>, budget: number, kvLayerBytes = 0): GroupPlan[] {
  const tied = w.wcls === w.tokenEmbedding;
  let items = groupItems(cfg, w, kvLayerBytes);
  if (items.some((it) => it.bytes > budget)) items = groupItems(cfg, w, 0);
  const plans = packGroups(items, tied, budget);
  const n = plans.length;
  if (n === 1) return plans;
  // Fewer bytes a memory never means fewer memories: search the least budget that keeps n.
  let lo = Math.max(...items.map((it) => it.bytes)) - 1;
  let hi = budget;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (packGroups(items, tied, mid).length <= n) hi = mid;
    else lo = mid;
  }
  return packGroups(items, tied, hi);
}

interface GroupItem {
  kind: "embedding" | "layer" | "classifier";
  bytes: number;
}

/** What the groups take in order, with their placed bytes (a layer's with its KV share). */
function groupItems(cfg: ModelConfig, w: Weights<Matrix>, kvLayerBytes: number): GroupItem[] {
  const bytes = placedBytes(cfg, w);
  const items: GroupItem[] = [];
  if (w.wcls !== w.tokenEmbedding) items.push({ kind: "embedding", bytes: bytes.embedding });
  for (const b of bytes.layers) items.push({ kind: "layer", bytes: b + kvLayerBytes });
  items.push({ kind: "classifier", bytes: bytes.classifier });
  return items;
}

/** Items in order into groups of at most `budget` bytes, each taking items while they fit. */
function packGroups(items: readonly GroupItem[], tied: boolean, budget: number): GroupPlan[] {
  const plans: GroupPlan[] = [];
  let cur: GroupPlan | null = null;
  let used = 0;
  let layer = 0;
  for (const it of items) {
    if (it.bytes > budget) throw new Error(`the model's ${it.kind} takes ${it.bytes} bytes placed, past one kernel memory's ${budget}`);
    if (cur === null || used + it.bytes > budget) {
      cur = { first: layer, end: layer, embedding: false, classifier: false };
      plans.push(cur);
      used = 0;
    }
    used += it.bytes;
    if (it.kind === "embedding") cur.embedding = true;
    else if (it.kind === "classifier") {
      cur.classifier = true;
      if (tied) cur.embedding = true;
    } else cur.end = ++layer;
  }
  return plans;
}

/**
 * Layers l0 .. l1 - 1 of a matrix stacked over L layers with rows of `cols`: views, nothing
 * copied. A stacked matrix gives the parts (or pieces of parts) that hold those layers.
 */
export function layerSlice(m: Matrix, cols: number, L: number, l0: number, l1: number): Matrix {
  const per = m.length / L;
  assert(Number.isInteger(per) && per % cols === 0, `matrix of ${m.length} is not ${L} layers of rows of ${cols}`);
  return sliceElements(m, l0 * per, l1 * per, cols);
}

/** Elements from .. to (whole rows) of m as views. */
function sliceElements(m: Matrix, from: number, to: number, cols: number): Matrix {
  if (m instanceof Float32Array) return m.subarray(from, to);
  if (!isStacked(m)) {
    const dt = m.dtype;
    return { dtype: dt, cols, length: to - from, bytes: m.bytes.subarray(matrixBytes(dt, from), matrixBytes(dt, to)) };
  }
  const parts: SimpleMatrix[] = [];
  let at = 0;
  for (const p of m.parts) {
    const lo = Math.max(from, at);
    const hi = Math.min(to, at + p.length);
    if (lo < hi) parts.push(sliceElements(p, lo - at, hi - at, cols) as SimpleMatrix);
    at += p.length;
  }
  return parts.length === 1 ? parts[0]! : { dtype: "stacked", cols, length: to - from, parts };
}

/** Floats per query in the attention kernel's score scratch (four queries at a time). */
export function attentionStride(cfg: ModelConfig): number {
  return Math.ceil(cfg.maxSeqLen / 4) * 4;
}

/** Bytes of one thread's scratch in the attention dispatch (kernels/assembly/attention.ts): its AttendJob, then scores. */
export function attentionScratchBytes(cfg: ModelConfig): number {
  const S = attentionStride(cfg);
  return ATTEND_JOB_BYTES + Math.max(4 * S + 2 * S * headDimOf(cfg), 4 * cfg.nKvHeads * S) * 4;
}

/** A wasm32 memory: 4 GiB. */
const MEMORY_BYTES = 2 ** 32;
/** Token rows a forward may carry that the room below is sized for (a 512-token prefill chunk, twice). */
const ROOM_ROWS = 1024;
/** The batch's K/V copies when the pool is outside the memory (a model in several groups). */
const ROOM_KV_COPIES = 2 ** 28;

/**
 * Bytes a group keeps beside its weights for what its kernels write: the RoPE tables, each
 * thread's attention scratch (both grow with the context: a 128K-context model's RoPE tables
 * alone take 134 MB), ROOM_ROWS rows of activations with their 8-bit copies, and the batch's
 * K/V copies. Past it, a forward would find no room to grow into.
 */
export function roomBytes(cfg: ModelConfig, threads: number): number {
  const hd = headDimOf(cfg);
  const rope = 2 * cfg.maxSeqLen * (hd / 2) * 8;
  const attention = threads * attentionScratchBytes(cfg);
  const qDim = qDimOf(cfg);
  const kvDim = kvDimOf(cfg);
  const perRow = 4 * (3 * cfg.dim + qDim + 2 * kvDim + 2 * cfg.hiddenDim) + 4 * kvDim + 8 * Math.max(cfg.dim, cfg.hiddenDim, qDim);
  return rope + attention + ROOM_ROWS * perRow + ROOM_KV_COPIES;
}

/** The bytes of weights one kernel memory may place for this model: what the room leaves, at most MAX_PLACED_BYTES. */
export function groupBudget(cfg: ModelConfig, threads: number): number {
  return Math.min(MAX_PLACED_BYTES, MEMORY_BYTES - roomBytes(cfg, threads));
}

/** Whether `bytes` more can be given out of a memory that has `used` taken, leaving the room. */
export function fitsWithRoom(cfg: ModelConfig, threads: number, used: number, bytes: number): boolean {
  return used + bytes + roomBytes(cfg, threads) <= MEMORY_BYTES;
}

/**
 * One kernel memory's share of the model and the activations its kernels work on. The scratch
 * arrays live in the memory (so no matmul copies them in or out) and grow, never shrink, to the
 * largest batch seen.
 */
export class LayerGroup {
  readonly mm: MatmulKernel;
  /** Its layers: first .. end - 1 (none for a group of the embedding or classifier alone). */
  readonly first: number;
  readonly end: number;
  readonly w: GroupWeights;
  readonly ropeCos: Float64Array;
  readonly ropeSin: Float64Array;

  // Per-row scratch, grown to the largest row count seen.
  cap = 0;
  x: Float32Array = new Float32Array(0);
  xb: Float32Array = new Float32Array(0);
  xb2: Float32Array = new Float32Array(0);
  q: Float32Array = new Float32Array(0);
  k: Float32Array = new Float32Array(0);
  v: Float32Array = new Float32Array(0);
  hb: Float32Array = new Float32Array(0);
  hb2: Float32Array = new Float32Array(0);
  rowPos: Int32Array = new Int32Array(0);
  /** Each row's K slot (layer 0) in the slab, as a byte address, when the slab is in this memory. */
  kvDst: Int32Array = new Int32Array(0);
  /** The rows' K then V as f16, on their way to a slab outside this memory (null on the fallback). */
  kvHalf: Uint8Array | null = null;
  kvHalf16: Uint16Array = new Uint16Array(0);
  // Per-sequence scratch, grown to the largest batch seen.
  seqCap = 0;
  lastX: Float32Array = new Float32Array(0);
  /** Per sequence, its blocks' byte addresses (maxBlocks slots each) for the attention kernel. */
  attTables: Int32Array = new Int32Array(0);
  /** The attention dispatch's parameters and pieces (kernels/assembly/attention.ts's layout). */
  attParams: Int32Array = new Int32Array(0);
  attPieces: Int32Array = new Int32Array(0);
  /** The batch's K/V blocks of one layer when the pool's slab is not in this memory. */
  kvScratch: Uint8Array | null = null;
  /**
   * Bytes of the memory its weights and norms took (with any gap below them): what roomBytes
   * does not count, so what a KV pool's share is weighed against (Transformer.kvSlab).
   */
  readonly placedBytes: number;
  /** Bytes given to KV pools' segments in this memory so far. */
  kvBytes = 0;
  /** The memory the last reserve allocated (-1: none yet): release gives back no more than it. */
  private scratchAt = -1;
  private scratchEnd = -1;

  constructor(cfg: ModelConfig, weights: Weights<Matrix>, plan: GroupPlan, opts: KernelOptions) {
    this.first = plan.first;
    this.end = plan.end;
    const L = cfg.nLayers;
    const placements: { matrix: Matrix; cols: number }[] = LAYER_MATRICES.map((k) => {
      const cols = matrixCols(cfg, k);
      return { matrix: layerSlice(weights[k], cols, L, plan.first, plan.end), cols };
    });
    const emb = plan.embedding ? placements.push({ matrix: weights.tokenEmbedding, cols: cfg.dim }) - 1 : -1;
    const cls = plan.classifier ? placements.push({ matrix: weights.wcls, cols: cfg.dim }) - 1 : -1;
    // Every matrix is read through its view on this memory's copy: nothing here keeps the
    // caller's matrices alive, so once the caller lets go each weight is held once.
    this.mm = new MatmulKernel(placements, opts);
    const views = this.mm.views;
    const tied = weights.wcls === weights.tokenEmbedding;
    const dim = cfg.dim;
    const norms = (a: Float32Array, from: number, to: number): Float32Array => {
      const out = this.mm.alloc(to - from);
      out.set(a.subarray(from, to));
      return out;
    };
    this.w = {
      wq: views[0]!,
      wk: views[1]!,
      wv: views[2]!,
      wo: views[3]!,
      w1: views[4]!,
      w2: views[5]!,
      w3: views[6]!,
      // The norms' weights and the RoPE tables live in the memory too, for its rmsnorm and rope.
      rmsAtt: norms(weights.rmsAtt, plan.first * dim, plan.end * dim),
      rmsFfn: norms(weights.rmsFfn, plan.first * dim, plan.end * dim),
      tokenEmbedding: emb >= 0 ? views[emb]! : plan.embedding && tied ? views[cls]! : null,
      wcls: cls >= 0 ? views[cls]! : null,
      rmsFinal: plan.classifier ? norms(weights.rmsFinal, 0, dim) : null,
    };
    this.placedBytes = this.mm.usedBytes;
    // RoPE as run.c: pair (i, i+1) of each head turns by pos * freq[i/2] (see ropeFrequencies).
    const half = headDimOf(cfg) / 2;
    const n = plan.end > plan.first ? cfg.maxSeqLen * half : 0;
    this.ropeCos = this.mm.allocF64(n);
    this.ropeSin = this.mm.allocF64(n);
    if (n > 0) {
      const freqs = ropeFrequencies(cfg);
      for (let p = 0; p < cfg.maxSeqLen; p++) {
        for (let k = 0; k < half; k++) {
          const freq = freqs[k]!;
          this.ropeCos[p * half + k] = Math.cos(p * freq);
          this.ropeSin[p * half + k] = Math.sin(p * freq);
        }
      }
    }
  }

  /** Whether layer l's weights are here. */
  holds(l: number): boolean {
    return l >= this.first && l < this.end;
  }

  /**
   * Room for `rows` token rows and `nSeq` sequences of up to maxBlocks blocks. The scratch grows
   * by doubling; when nothing was allocated after it, it is given back and allocated anew in its
   * own place, so a growing batch leaves no dead copy behind: the 512-row scratch left under a
   * 1024-row one was 55 MB of a 1B model's resident memory (bench/llamacpp.ts' batch of 8 after
   * its 512-token prefill). Otherwise (a multi-group model's K/V copies came after it) only the
   * part that grows moves up, and only that part is given back the next time.
   */
  reserve(cfg: ModelConfig, qDim: number, kvDim: number, rows: number, nSeq: number, maxBlocks: number): void {
    const growRows = rows > this.cap;
    const growSeqs = nSeq > this.seqCap;
    if (!growRows && !growSeqs) return;
    const mm = this.mm;
    const rowCap = growRows ? Math.max(rows, this.cap * 2) : this.cap;
    const seqCap = growSeqs ? Math.max(nSeq, this.seqCap * 2) : this.seqCap;
    const whole = this.scratchEnd === mm.usedBytes;
    if (whole) mm.release(this.scratchAt);
    const at = mm.usedBytes;
    if (whole || growRows) this.allocRows(cfg, qDim, kvDim, rowCap);
    if (whole || growSeqs) this.allocSeqs(cfg, seqCap, maxBlocks);
    this.scratchAt = at;
    this.scratchEnd = mm.usedBytes;
  }

  private allocRows(cfg: ModelConfig, qDim: number, kvDim: number, cap: number): void {
    const mm = this.mm;
    const { dim, hiddenDim } = cfg;
    this.x = mm.alloc(cap * dim);
    // xb holds the normed input (dim) and then the attention output (qDim).
    this.xb = mm.alloc(cap * Math.max(dim, qDim));
    this.xb2 = mm.alloc(cap * dim);
    this.q = mm.alloc(cap * qDim);
    this.k = mm.alloc(cap * kvDim);
    this.v = mm.alloc(cap * kvDim);
    this.hb = mm.alloc(cap * hiddenDim);
    this.hb2 = mm.alloc(cap * hiddenDim);
    this.kvHalf = mm.allocBytes(cap * 2 * kvDim * 2);
    if (this.kvHalf !== null) this.kvHalf16 = new Uint16Array(this.kvHalf.buffer, this.kvHalf.byteOffset, cap * 2 * kvDim);
    this.rowPos = mm.allocInts(cap);
    this.kvDst = mm.allocInts(cap);
    this.cap = cap;
  }

  private allocSeqs(cfg: ModelConfig, cap: number, maxBlocks: number): void {
    const mm = this.mm;
    this.lastX = mm.alloc(cap * cfg.dim);
    this.attParams = mm.allocInts(ATT_PARAM_INTS(cap));
    this.attTables = mm.allocInts(cap * maxBlocks);
    this.attPieces = mm.allocInts(3 * cap * cfg.nKvHeads);
    this.seqCap = cap;
  }
}

// The attention dispatch's parameter layout (kernels/assembly/attention.ts): ATT_SEQS shared
// slots, then per sequence out, q, table, firstPos, rows.
export const ATT_SEQS = 9;
export const ATT_SEQ_INTS = 5;
const ATT_PARAM_INTS = (nSeq: number): number => ATT_SEQS + ATT_SEQ_INTS * nSeq;
