import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Matrix } from "../../src/model/compute/packed.ts";
import { type ModelConfig, Transformer } from "../../src/model/index.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import type { Weights } from "../../src/model/compute/weights.ts";
import { writeLlama2cCheckpoint } from "../../src/model/load/llama2c.ts";
import { writeLlama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { argmax, newPool, Seq, step, TINY } from "./helpers.ts";

/** The llama2.c test checkpoint's shape, with a context long enough for the greedy runs. */
export const CKPT: ModelConfig = { ...TINY, maxSeqLen: 48 };

export const PROMPTS: number[][] = [[1, 5, 9, 33, 2], [1, 60, 61, 62, 7, 7, 7, 12, 40], [3]];

/** Greedy decoding at token level: every step's logits and the tokens chosen. */
export function greedy(cfg: ModelConfig, w: Weights<Matrix>, prompt: readonly number[], n: number): { tokens: number[]; logits: Float32Array[] } {
  const m = new Transformer(cfg, w);
  const seq = new Seq(newPool(cfg));
  const logits: Float32Array[] = [step(m, seq, prompt)];
  const tokens: number[] = [];
  for (let i = 0; i < n; i++) {
    tokens.push(argmax(logits.at(-1)!));
    if (i + 1 < n) logits.push(step(m, seq, [tokens.at(-1)!]));
  }
  return { tokens, logits };
}

export function maxAbsDiff(a: readonly Float32Array[], b: readonly Float32Array[]): number {
  let m = 0;
  for (let i = 0; i < Math.min(a.length, b.length); i++) for (let j = 0; j < a[i]!.length; j++) m = Math.max(m, Math.abs(a[i]![j]! - b[i]![j]!));
  return m;
}

export function tempDir(tag: string): { dir: string; path: (...p: string[]) => string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `tl-${tag}-`));
  return { dir, path: (...p) => join(dir, ...p), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** The reference every format is compared with: the weights through a llama2.c file and its loader. */
export function llama2cReference(
  dir: string,
  cfg: ModelConfig,
  w: Weights,
  prompt: readonly number[],
  n: number,
): { tokens: number[]; logits: Float32Array[] } {
  writeLlama2cCheckpoint(join(dir, "ckpt.bin"), cfg, w, false);
  writeLlama2cTokenizer(join(dir, "tok.bin"), [
    { piece: "<unk>", score: 0 },
    { piece: "<s>", score: 0 },
    { piece: "</s>", score: 0 },
  ]);
  const m = readModelFiles(join(dir, "ckpt.bin"), { tokenizerPath: join(dir, "tok.bin") });
  if (m.format !== "llama2c") throw new Error(`reference loaded as ${m.format}`);
  return greedy(m.cfg, m.weights, prompt, n);
}
