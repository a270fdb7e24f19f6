import type { KvShape } from "../codec/index.ts";
import type { ModelConfig } from "./config.ts";
import type { DType } from "./packed.ts";
import type { KvSlab, SeqChunk } from "./transformer.ts";
import type { WeightStats } from "./assemble-weights.ts";

/**
 * What the engine's thread and its model thread share, and the messages between them.
 *
 * A step crosses by shared memory alone: the engine writes the plan into `plan`, then bumps
 * ctrl[GEN] (Atomics.notify); the model thread runs the forward over the shared KV slab, writes
 * the logits into `logits`, then sets ctrl[DONE] = GEN. A forward that throws writes its message
 * into the error area and sets ctrl[FAILED] = GEN first (shared memory again: a message posted
 * from the model thread's loop may sit undelivered). Buffers grow rarely: the new ones go over
 * postMessage with a version, and ctrl[VER] names the version a step needs, so the model
 * thread never reads a plan through a buffer it has not been given yet.
 */
export const GEN = 0;
export const DONE = 1;
export const FAILED = 2;
export const VER = 3;
/** Bytes of UTF-8 in the error area, which follows the CTRL_INTS ints of ctrl. */
export const ERR_LEN = 4;
export const CTRL_INTS = 5;
export const ERR_BYTES = 1024;
export const CTRL_BYTES = CTRL_INTS * 4 + ERR_BYTES;

/** Writes a failed forward's message into ctrl's error area (cut to fit). */
export function writeError(ctrl: Int32Array, message: string): void {
  const area = new Uint8Array(ctrl.buffer, CTRL_INTS * 4, ERR_BYTES);
  const bytes = new TextEncoder().encode(message).subarray(0, ERR_BYTES);
  area.set(bytes);
  Atomics.store(ctrl, ERR_LEN, bytes.length);
}

/** The message writeError left (TextDecoder refuses shared views: it reads a copy). */
export function readError(ctrl: Int32Array): string {
  const n = Atomics.load(ctrl, ERR_LEN);
  return new TextDecoder().decode(new Uint8Array(ctrl.buffer, CTRL_INTS * 4, n).slice());
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
    n += 3 + c.tokens.length + blocksOf(c, blockTokens);
  }
  return n;
}

/** [nSeq, then per chunk: startPos, nTokens, nBlocks, tokens..., blockIds...] */
export function writePlan(plan: Int32Array, batch: readonly SeqChunk[], blockTokens: number): void {
  plan[0] = batch.length;
  let o = 1;
  for (let s = 0; s < batch.length; s++) {
    const c = batch[s]!;
    const nt = c.tokens.length;
    const nb = blocksOf(c, blockTokens);
    plan[o] = c.startPos;
    plan[o + 1] = nt;
    plan[o + 2] = nb;
    o += 3;
    for (let t = 0; t < nt; t++) plan[o + t] = c.tokens[t]!;
    o += nt;
    for (let b = 0; b < nb; b++) plan[o + b] = c.blockTable[b]!;
    o += nb;
  }
}

/** The chunks of a plan, as views into it (valid until the next plan is written). */
export function readPlan(plan: Int32Array, into: SeqChunk[]): SeqChunk[] {
  const n = plan[0]!;
  into.length = n;
  let o = 1;
  for (let s = 0; s < n; s++) {
    const startPos = plan[o]!;
    const nt = plan[o + 1]!;
    const nb = plan[o + 2]!;
    o += 3;
    const tokens = plan.subarray(o, o + nt);
    o += nt;
    into[s] = { startPos, tokens, blockTable: plan.subarray(o, o + nb) };
    o += nb;
  }
  return into;
}

// Only the blocks the forward touches: a table may already hold blocks reserved past the chunk.
function blocksOf(c: SeqChunk, blockTokens: number): number {
  return Math.min(c.blockTable.length, Math.ceil((c.startPos + c.tokens.length) / blockTokens));
}
