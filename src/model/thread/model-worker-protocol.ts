import type { KvShape } from "../../codec/index.ts";
import { LogitsError, Pcg32, sample, type SamplingConfig } from "../../rng/index.ts";
import type { LogitsRows } from "./logits-rows.ts";
import type { ModelConfig, DType, KvPoolSize, KvSlab, SeqChunk } from "../compute/index.ts";
import type { WeightStats } from "../load/index.ts";

/**
 * What the engine's thread and its model thread share, and the messages between them.
 *
 * A step crosses by shared memory alone: the engine writes the plan of step `gen` into the plan
 * buffer of slot slotOf(gen), then bumps ctrl[GEN] (notified when the thread waits: IDLE); the model thread runs every
 * gen in order over the shared KV slab, writes the logits into that slot's logits buffer (and,
 * after them in the same buffer, the tokens of the rows the plan asks it to sample itself), then
 * sets ctrl[DONE] = gen. SLOTS slots let the engine post the steps after gen while gen runs: a
 * token written prevToken(r) is row r's sampled token of the step before, which the model thread
 * fills in itself. Only the model thread writes a logits buffer, so the engine may reuse a plan
 * buffer (gen + SLOTS) while gen + 1 still has to read gen's sampled tokens.
 * A forward that throws writes its message into its slot's error area and sets ctrl[FAILED + slot]
 * = gen first (shared memory again: a message posted from the model thread's loop may sit
 * undelivered); a forward that needs the tokens of a failed one fails too. A row whose logits
 * cannot be sampled (LogitsError: that request's alone) is SAMPLE_FAILED, not a failed forward:
 * the engine ends its sequence, and a step posted after it computes a stand-in token in its row
 * (the row's outputs are dropped), so the batch goes on. Buffers grow rarely:
 * the new ones go over postMessage with a version, and ctrl[VER] names the version a step needs,
 * so the model thread never reads a plan through a buffer it has not been given yet.
 */
/** Steps in flight at most (a power of two: slotOf masks the wrapping Int32 gen). */
export const SLOTS = 4;
export const GEN = 0;
export const DONE = 1;
export const VER = 2;
/**
 * The model thread notifies DONE only for a gen at or past ctrl[WAKE] (or a failed one), so an
 * engine with steps queued behind one it needn't hear of at once is woken once for several. The
 * engine stores WAKE before it reads DONE and the model thread DONE before it reads WAKE, so one of
 * them sees the other's store: no end is missed.
 */
export const WAKE = 3;
/**
 * 1 while the model thread waits for a gen to be posted: the engine notifies GEN only then (a
 * notify is a call into the runtime, once a step otherwise). The engine stores GEN before it
 * reads IDLE and the model thread IDLE before it reads GEN to wait on it, so one of them sees
 * the other's store: no post is missed.
 */
export const IDLE = 4;
/** ctrl[FAILED + slot]: the last gen of that slot that failed. */
export const FAILED = 5;
/** ctrl[ERR_LEN + slot]: bytes of UTF-8 in that slot's error area, which follow the CTRL_INTS ints of ctrl. */
export const ERR_LEN = FAILED + SLOTS;
export const CTRL_INTS = ERR_LEN + SLOTS;
export const ERR_BYTES = 256;
/** Then, 8-aligned, the model thread's counters (STAT_*), one Float64 each. */
const STATS_AT = (CTRL_INTS * 4 + SLOTS * ERR_BYTES + 7) & ~7;
/** Milliseconds the model thread has spent running forwards. */
export const STAT_BUSY_MS = 0;
/** Times it found no step posted after finishing one (it waited on the engine). */
export const STAT_IDLE_WAITS = 1;
/** Milliseconds it spent in those waits. */
export const STAT_IDLE_MS = 2;
/** Times it woke the engine (Atomics.notify on DONE). */
export const STAT_NOTIFIES = 3;
/**
 * Milliseconds it spent inside those notifies: with no idle core the woken engine thread tends to
 * run on the notifier's own core at once, so this is about the engine's work per wake, taken
 * from the model.
 */
export const STAT_NOTIFY_MS = 4;
const STATS = 5;
export const CTRL_BYTES = STATS_AT + STATS * 8;

/** The model thread's counters (STAT_*), written by it alone, for where a decode's time goes (bench/engine-loop). */
export function statsCells(ctrl: Int32Array): Float64Array {
  return new Float64Array(ctrl.buffer, STATS_AT, STATS);
}

/** The plan buffer (and logits buffer) of step `gen`. */
export function slotOf(gen: number): number {
  return gen & (SLOTS - 1);
}

/** A chunk token that stands for the token the model sampled for row `row` in the step before. */
export function prevToken(row: number): number {
  return -1 - row;
}

/** Writes a failed forward's message into its slot's error area (cut to fit). */
export function writeError(ctrl: Int32Array, slot: number, message: string): void {
  const area = new Uint8Array(ctrl.buffer, CTRL_INTS * 4 + slot * ERR_BYTES, ERR_BYTES);
  const bytes = new TextEncoder().encode(message).subarray(0, ERR_BYTES);
  area.set(bytes);
  Atomics.store(ctrl, ERR_LEN + slot, bytes.length);
}

/** The message writeError left in `slot` (TextDecoder refuses shared views: it reads a copy). */
export function readError(ctrl: Int32Array, slot: number): string {
  const n = Atomics.load(ctrl, ERR_LEN + slot);
  return new TextDecoder().decode(new Uint8Array(ctrl.buffer, CTRL_INTS * 4 + slot * ERR_BYTES, n).slice());
}

/** How the model thread loads its model: the same options `engine` takes. */
export interface ModelThreadOptions {
  modelPath?: string;
  tokenizerPath?: string;
  maxSeqLen?: number;
  dtype?: DType | "as-stored";
  threads?: number;
  /** false: kernel memory on 4 KiB pages (KernelOptions.hugePages). */
  hugePages?: boolean;
  /** Bytes of weights one kernel memory may place (TransformerOptions.groupBytes): tests lower it. */
  groupBytes?: number;
  /** The KV pool the engine will build (TransformerOptions.kvPool). */
  kvPool?: KvPoolSize;
}

export type ToModelThread =
  | { type: "load"; opts: ModelThreadOptions; ctrl: SharedArrayBuffer }
  | {
      type: "buffers";
      version: number;
      /** The slot plan and logits are for. */
      slot: number;
      /** The pool's segments in layer order; inKernel: they are the rooms the thread gave (kv-slab) in its kernel memories. */
      pool?: { shape: KvShape; numBlocks: number; segments: KvSlab[]; inKernel: boolean };
      plan?: SharedArrayBuffer;
      logits?: SharedArrayBuffer;
    }
  /** Asks for room for a KV pool of `bytes` in the model's kernel memories (answered by kv-slab). */
  | { type: "kv-slab"; bytes: number }
  /**
   * A structured output's matcher on the thread, for rows it samples itself: `open` compiles
   * the spec against `vocab` (sent with the first open of a vocabulary) and replays the
   * sequence's output tokens so far; `close` drops it. ctrl[VER] names the version of an open,
   * so no plan that names it is read before it is.
   */
  | {
      type: "constraint";
      version: number;
      open?: { id: number; kind: string; source: string; replay: number[]; vocab?: { encoded: readonly string[]; stopIds: readonly number[] } };
      close?: number;
    }
  | { type: "close" };

/** What the model thread tells about the model it holds. */
export interface LoadedInfo {
  name: string;
  cfg: ModelConfig;
  eosIds: number[];
  stats: WeightStats;
  dtype: string;
  threads: number;
  /** What runs the matmuls (Transformer.kernels). */
  kernels: string;
  /** Kernel memories the weights are spread over (Transformer.memories). */
  memories: number;
  /** Whether every kernel memory is on 2 MiB pages (Transformer.hugePages). */
  hugePages: boolean;
}

export type FromModelThread =
  | { type: "loaded"; info: LoadedInfo }
  | { type: "load-failed"; message: string }
  /** The room asked for, a segment per memory holding layers, or null when one cannot hold its share (or there is none). */
  | { type: "kv-slab"; slab: KvSlab[] | null };

/** Int32s the plan of `batch` takes: the count, then per chunk its header, tokens and blocks. */
export function planInts(batch: readonly SeqChunk[], blockTokens: number): number {
  let n = 1;
  for (let s = 0; s < batch.length; s++) {
    const c = batch[s]!;
    n += ROW_INTS + c.tokens.length + blocksOf(c, blockTokens);
  }
  return n;
}

/**
 * How the model samples a row itself: the request's settings and, when they draw (temperature >
 * 0), the sample stream as it stands at that token (the model draws from a copy).
 */
export interface RowSampling {
  cfg: SamplingConfig;
  rng: Pcg32 | null;
  /**
   * A structured output: the id the thread's own matcher for it was opened under
   * (openConstraint), 0 for none; and how many output tokens the sequence has before this one,
   * all of which that matcher must have taken when the row is masked. Absent: none.
   */
  constraint?: number;
  outputs?: number;
}

/** kind (0 none, 1 without a stream, 2 with one), temperature and top_p as f64 bits, top_k, the stream's state and increment halves, the constraint id and outputs. */
const SAMPLING_INTS = 12;
/** A chunk's header: startPos, nTokens, nBlocks, then its RowSampling. */
const ROW_INTS = 3 + SAMPLING_INTS;
const f64 = new Float64Array(1);
const f64Ints = new Int32Array(f64.buffer);

/** [nSeq, then per chunk: its ROW_INTS header, tokens..., blockIds...] */
export function writePlan(plan: Int32Array, batch: readonly SeqChunk[], blockTokens: number, sampling?: readonly (RowSampling | null)[]): void {
  plan[0] = batch.length;
  let o = 1;
  for (let s = 0; s < batch.length; s++) {
    const c = batch[s]!;
    const nt = c.tokens.length;
    const nb = blocksOf(c, blockTokens);
    plan[o] = c.startPos;
    plan[o + 1] = nt;
    plan[o + 2] = nb;
    writeSampling(plan, o + 3, sampling?.[s] ?? null);
    o += ROW_INTS;
    for (let t = 0; t < nt; t++) plan[o + t] = c.tokens[t]!;
    o += nt;
    for (let b = 0; b < nb; b++) plan[o + b] = c.blockTable[b]!;
    o += nb;
  }
}

// Only what readSampling reads for the kind written (no fill: a call into the runtime a row).
function writeSampling(plan: Int32Array, o: number, r: RowSampling | null): void {
  if (r === null) {
    plan[o] = 0;
    return;
  }
  plan[o] = r.rng ? 2 : 1;
  f64[0] = r.cfg.temperature;
  plan[o + 1] = f64Ints[0]!;
  plan[o + 2] = f64Ints[1]!;
  f64[0] = r.cfg.topP;
  plan[o + 3] = f64Ints[0]!;
  plan[o + 4] = f64Ints[1]!;
  plan[o + 5] = r.cfg.topK | 0;
  // As words, not through the bigint state and inc: no allocation per row per step.
  r.rng?.writeWords(plan, o + 6);
  plan[o + 10] = r.constraint ?? 0;
  plan[o + 11] = r.outputs ?? 0;
}

function readSampling(plan: Int32Array, o: number, row: ReadRow): RowSampling | null {
  const kind = plan[o]!;
  if (kind === 0) return null;
  const cfg = row.sampling.cfg;
  f64Ints[0] = plan[o + 1]!;
  f64Ints[1] = plan[o + 2]!;
  cfg.temperature = f64[0]!;
  f64Ints[0] = plan[o + 3]!;
  f64Ints[1] = plan[o + 4]!;
  cfg.topP = f64[0]!;
  cfg.topK = plan[o + 5]! >>> 0;
  row.sampling.rng = kind === 1 ? null : row.rng.readWords(plan, o + 6);
  row.sampling.constraint = plan[o + 10]!;
  row.sampling.outputs = plan[o + 11]!;
  return row.sampling;
}

/** A row's sampled token when its logits could not be sampled (sampleRows). */
export const SAMPLE_FAILED = -2;

/**
 * A slot's logits buffer for `rows` rows of `vocab` logits, then `rows` Int32 sampled tokens
 * (the token the model sampled for each row, -1 where it sampled none, SAMPLE_FAILED where
 * the row's logits could not be sampled).
 */
export function logitsBufferBytes(rows: number, vocab: number): number {
  return rows * (vocab + 1) * 4;
}

/** The logits and sampled views of a buffer logitsBufferBytes sized. */
export function logitsViews(buffer: SharedArrayBuffer, vocab: number): { logits: Float32Array; sampled: Int32Array } {
  const rows = buffer.byteLength / ((vocab + 1) * 4);
  return { logits: new Float32Array(buffer, 0, rows * vocab), sampled: new Int32Array(buffer, rows * vocab * 4, rows) };
}

/** One row's records, refilled by every plan read (so a decode reads its plans allocating nothing). */
interface ReadRow {
  chunk: { startPos: number; tokens: number[]; blockTable: number[] };
  sampling: RowSampling;
  /** The row's stream, read into in place. */
  rng: Pcg32;
}

/** A plan as the model thread reads it: its rows' records, valid until the next plan is read into them. */
export interface ReadPlan {
  chunks: SeqChunk[];
  /** Per chunk: how the model samples its row, or null. */
  sampling: (RowSampling | null)[];
  readonly rows: ReadRow[];
}

export function newReadPlan(): ReadPlan {
  return { chunks: [], sampling: [], rows: [] };
}

/**
 * Reads a plan, resolving each prevToken(r) from `prev` (the sampled area of the step before; null
 * when that step failed or is unknown, which makes such a token an error).
 */
export function readPlan(plan: Int32Array, prev: Int32Array | null, into: ReadPlan): ReadPlan {
  const n = plan[0]!;
  // Set only when the batch changes size: each set is a call into the runtime.
  if (into.chunks.length !== n) into.chunks.length = into.sampling.length = n;
  while (into.rows.length < n) {
    const chunk = { startPos: 0, tokens: [], blockTable: [] };
    into.rows.push({ chunk, sampling: { cfg: { temperature: 0, topP: 1, topK: 0 }, rng: null, constraint: 0, outputs: 0 }, rng: Pcg32.fromState(0n, 1n) });
  }
  let o = 1;
  for (let s = 0; s < n; s++) {
    const row = into.rows[s]!;
    const c = row.chunk;
    c.startPos = plan[o]!;
    const nt = plan[o + 1]!;
    const nb = plan[o + 2]!;
    into.sampling[s] = readSampling(plan, o + 3, row);
    o += ROW_INTS;
    // Cut, then written in order (a write at the end appends): the arrays stay dense.
    if (c.tokens.length > nt) c.tokens.length = nt;
    for (let t = 0; t < nt; t++) {
      const token = plan[o + t]!;
      c.tokens[t] = token < 0 ? previousToken(prev, -1 - token) : token;
    }
    o += nt;
    if (c.blockTable.length > nb) c.blockTable.length = nb;
    for (let b = 0; b < nb; b++) c.blockTable[b] = plan[o + b]!;
    o += nb;
    into.chunks[s] = c;
  }
  return into;
}

function previousToken(prev: Int32Array | null, row: number): number {
  if (prev === null) throw new Error(`plan names row ${row}'s token of a step that failed`);
  const t = row < prev.length ? prev[row]! : -1;
  // Its sequence ends when that step settles; the row's outputs are never read.
  if (t === SAMPLE_FAILED) return 0;
  if (t < 0) throw new Error(`plan names row ${row}'s token of the step before, which sampled none there`);
  return t;
}

/**
 * The tokens of the rows the plan samples, by the sampler the engine itself samples with
 * (-1 where it samples none). Logits one row cannot be sampled from fail that row alone
 * (SAMPLE_FAILED), never the step.
 */
export function sampleRows(
  p: ReadPlan,
  out: Float32Array,
  rows: LogitsRows,
  tokens: Int32Array,
  /** How a row with a structured output (RowSampling.constraint) is sampled: the thread's matchers. */
  constrained?: (row: number, logits: Float32Array) => number,
): void {
  for (let r = 0; r < p.chunks.length; r++) {
    const s = p.sampling[r];
    if (!s) {
      tokens[r] = -1;
      continue;
    }
    try {
      tokens[r] = s.constraint && constrained ? constrained(r, rows.row(out, r)) : sample(rows.row(out, r), s.cfg, s.rng);
    } catch (e) {
      if (!(e instanceof LogitsError)) throw e;
      tokens[r] = SAMPLE_FAILED;
    }
  }
}

// Only the blocks the forward touches: a table may already hold blocks reserved past the chunk.
function blocksOf(c: SeqChunk, blockTokens: number): number {
  return Math.min(c.blockTable.length, Math.ceil((c.startPos + c.tokens.length) / blockTokens));
}
