import type { KvShape } from "../codec/index.ts";
import type { ModelConfig } from "./config.ts";
import type { DType } from "./packed.ts";
import type { KvSlab, SeqChunk } from "./transformer.ts";
import type { WeightStats } from "./assemble-weights.ts";

/**
 * What the engine's thread and its model thread share, and the messages between them.
 *
 * A step crosses by shared memory alone: the engine writes the plan of step `gen` into the plan
 * buffer of slot slotOf(gen), then bumps ctrl[GEN] (Atomics.notify); the model thread runs every
 * gen in order over the shared KV slab, writes the logits into that slot's logits buffer (and,
 * after them in the same buffer, the tokens of the rows the plan asks it to greedy-sample), then
 * sets ctrl[DONE] = gen. SLOTS slots let the engine post the steps after gen while gen runs: a
 * token written prevToken(r) is row r's sampled token of the step before, which the model thread
 * fills in itself. Only the model thread writes a logits buffer, so the engine may reuse a plan
 * buffer (gen + SLOTS) while gen + 1 still has to read gen's sampled tokens.
 * A forward that throws writes its message into its slot's error area and sets ctrl[FAILED + slot]
 * = gen first (shared memory again: a message posted from the model thread's loop may sit
 * undelivered); a forward that needs the tokens of a failed one fails too. Buffers grow rarely:
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
/** ctrl[FAILED + slot]: the last gen of that slot that failed. */
export const FAILED = 4;
/** ctrl[ERR_LEN + slot]: bytes of UTF-8 in that slot's error area, which follow the CTRL_INTS ints of ctrl. */
export const ERR_LEN = FAILED + SLOTS;
export const CTRL_INTS = ERR_LEN + SLOTS;
export const ERR_BYTES = 256;
/** Then, 8-aligned, one Float64: milliseconds the model thread has spent in forwards (busyCell). */
const BUSY_AT = (CTRL_INTS * 4 + SLOTS * ERR_BYTES + 7) & ~7;
export const CTRL_BYTES = BUSY_AT + 8;

/** The model thread's busy milliseconds, for the share of a decode's time the model computed (bench/engine-loop). */
export function busyCell(ctrl: Int32Array): Float64Array {
  return new Float64Array(ctrl.buffer, BUSY_AT, 1);
}

/** The plan buffer (and logits buffer) of step `gen`. */
export function slotOf(gen: number): number {
  return gen & (SLOTS - 1);
}

/** A chunk token that stands for row `row`'s greedy-sampled token of the step before. */
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
}

export type ToModelThread =
  | { type: "load"; opts: ModelThreadOptions; ctrl: SharedArrayBuffer }
  | {
      type: "buffers";
      version: number;
      /** The slot plan and logits are for. */
      slot: number;
      /** inKernel: the slab is room the thread gave (kv-slab) in its kernel memory, at slabOffset. */
      pool?: { shape: KvShape; numBlocks: number; slab: SharedArrayBuffer; slabOffset: number; inKernel: boolean };
      plan?: SharedArrayBuffer;
      logits?: SharedArrayBuffer;
    }
  /** Asks for room for a KV slab of `bytes` in the model's kernel memory (answered by kv-slab). */
  | { type: "kv-slab"; bytes: number }
  | { type: "close" };

/** What the model thread tells about the model it holds. */
export interface LoadedInfo {
  name: string;
  cfg: ModelConfig;
  eosIds: number[];
  stats: WeightStats;
  dtype: string;
  threads: number;
}

export type FromModelThread =
  | { type: "loaded"; info: LoadedInfo }
  | { type: "load-failed"; message: string }
  /** The room asked for, or null when the kernel memory cannot hold it (or there is none). */
  | { type: "kv-slab"; slab: KvSlab | null };

/** Int32s the plan of `batch` takes: the count, then per chunk its header, tokens and blocks. */
export function planInts(batch: readonly SeqChunk[], blockTokens: number): number {
  let n = 1;
  for (let s = 0; s < batch.length; s++) {
    const c = batch[s]!;
    n += 4 + c.tokens.length + blocksOf(c, blockTokens);
  }
  return n;
}

/** [nSeq, then per chunk: startPos, nTokens, nBlocks, greedy, tokens..., blockIds...] */
export function writePlan(plan: Int32Array, batch: readonly SeqChunk[], blockTokens: number, greedy?: readonly boolean[]): void {
  plan[0] = batch.length;
  let o = 1;
  for (let s = 0; s < batch.length; s++) {
    const c = batch[s]!;
    const nt = c.tokens.length;
    const nb = blocksOf(c, blockTokens);
    plan[o] = c.startPos;
    plan[o + 1] = nt;
    plan[o + 2] = nb;
    plan[o + 3] = greedy?.[s] ? 1 : 0;
    o += 4;
    for (let t = 0; t < nt; t++) plan[o + t] = c.tokens[t]!;
    o += nt;
    for (let b = 0; b < nb; b++) plan[o + b] = c.blockTable[b]!;
    o += nb;
  }
}

/**
 * A slot's logits buffer for `rows` rows of `vocab` logits, then `rows` Int32 sampled tokens
 * (the model's greedy token of each row, -1 where it sampled none).
 */
export function logitsBufferBytes(rows: number, vocab: number): number {
  return rows * (vocab + 1) * 4;
}

/** The logits and sampled views of a buffer logitsBufferBytes sized. */
export function logitsViews(buffer: SharedArrayBuffer, vocab: number): { logits: Float32Array; sampled: Int32Array } {
  const rows = buffer.byteLength / ((vocab + 1) * 4);
  return { logits: new Float32Array(buffer, 0, rows * vocab), sampled: new Int32Array(buffer, rows * vocab * 4, rows) };
}

/** A plan as the model thread reads it: its chunks as views into it (valid until the next plan of its slot). */
export interface ReadPlan {
  chunks: SeqChunk[];
  /** Per chunk: the model greedy-samples its row. */
  greedy: boolean[];
}

/**
 * Reads a plan, resolving each prevToken(r) from `prev` (the sampled area of the step before; null
 * when that step failed or is unknown, which makes such a token an error).
 */
export function readPlan(plan: Int32Array, prev: Int32Array | null, into: ReadPlan): ReadPlan {
  const n = plan[0]!;
  into.chunks.length = n;
  into.greedy.length = n;
  let o = 1;
  for (let s = 0; s < n; s++) {
    const startPos = plan[o]!;
    const nt = plan[o + 1]!;
    const nb = plan[o + 2]!;
    into.greedy[s] = plan[o + 3] === 1;
    o += 4;
    const tokens = plan.subarray(o, o + nt);
    for (let t = 0; t < nt; t++) if (tokens[t]! < 0) tokens[t] = previousToken(prev, -1 - tokens[t]!);
    o += nt;
    into.chunks[s] = { startPos, tokens, blockTable: plan.subarray(o, o + nb) };
    o += nb;
  }
  return into;
}

function previousToken(prev: Int32Array | null, row: number): number {
  if (prev === null) throw new Error(`plan names row ${row}'s token of a step that failed`);
  const t = row < prev.length ? prev[row]! : -1;
  if (t < 0) throw new Error(`plan names row ${row}'s token of the step before, which sampled none there`);
  return t;
}

// Only the blocks the forward touches: a table may already hold blocks reserved past the chunk.
function blocksOf(c: SeqChunk, blockTokens: number): number {
  return Math.min(c.blockTable.length, Math.ceil((c.startPos + c.tokens.length) / blockTokens));
}
