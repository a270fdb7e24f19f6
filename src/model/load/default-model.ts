import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { threadId } from "node:worker_threads";
import configPath from "../../../models/tl-kjv-small/config.json" with { type: "file" };
import generationConfigPath from "../../../models/tl-kjv-small/generation_config.json" with { type: "file" };
import weightsPath from "../../../models/tl-kjv-small/model.safetensors" with { type: "file" };
import tokenizerPath from "../../../models/tl-kjv-small/tokenizer.json" with { type: "file" };
import tokenizerConfigPath from "../../../models/tl-kjv-small/tokenizer_config.json" with { type: "file" };

/** The model `--model` defaults to: trained by tools/train on the King James Bible (models/README.md). */
export const DEFAULT_MODEL_NAME = "tl-kjv-small";

// `with { type: "file" }` makes each a path string (TypeScript types the JSON ones as their contents).
const EMBEDDED: Record<string, string> = {
  "config.json": String(configPath),
  "generation_config.json": String(generationConfigPath),
  "model.safetensors": String(weightsPath),
  "tokenizer.json": String(tokenizerPath),
  "tokenizer_config.json": String(tokenizerConfigPath),
};

/**
 * The default model's Hugging Face folder, read by the same loader as any user's folder. From a
 * checkout the imports are the files in models/; a compiled binary holds them under hashed names
 * in its own read-only file system, so they are written once into a folder of their real names
 * (keyed by those content hashes, so a new binary never reads an old copy).
 */
export function defaultModelDir(): string {
  const dirs = new Set(Object.values(EMBEDDED).map((p) => dirname(p)));
  const named = Object.entries(EMBEDDED).every(([name, p]) => basename(p) === name);
  if (dirs.size === 1 && named) return [...dirs][0]!;
  const key = Bun.hash(
    Object.values(EMBEDDED)
      .map((p) => basename(p))
      .join("\n"),
  ).toString(16);
  const dir = join(tmpdir(), "tl-engine-models", `${DEFAULT_MODEL_NAME}-${key}`, DEFAULT_MODEL_NAME);
  if (existsSync(join(dir, "config.json"))) return dir;
  // Written beside the final folder and renamed, so a concurrent start never sees half a folder;
  // named by thread too, since an engine's model thread reads the model while its main thread does.
  const tmp = `${dir}.${process.pid}.${threadId}.tmp`;
  mkdirSync(tmp, { recursive: true });
  for (const [name, p] of Object.entries(EMBEDDED)) writeFileSync(join(tmp, name), readFileSync(p));
  try {
    renameSync(tmp, dir);
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(join(dir, "config.json"))) throw err;
  }
  return dir;
}
