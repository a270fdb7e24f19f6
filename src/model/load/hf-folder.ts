import { existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import type { TensorSource } from "./assemble-weights.ts";
import { hfModelSpec, idList } from "./hf-config.ts";
import { mapFileBytes } from "../compute/index.ts";
import type { ModelSpec } from "./model-spec.ts";
import type { RawTensor } from "./raw-tensor.ts";
import { parseSafetensors } from "./safetensors.ts";
import type { TokenizerSource } from "../../tokenizer/index.ts";
import { quote } from "../../codec/index.ts";

/** JSON and template files of a model folder are small; anything past this is not what it claims to be. */
const MAX_JSON_BYTES = 64 * 1024 * 1024;

/** A small text file of the folder (JSON, a template), or null when it is absent and not required. */
function readText(dir: string, file: string, required: boolean): string | null {
  const path = join(dir, file);
  if (!existsSync(path)) {
    if (required) throw new Error(`${dir}: ${file} is missing`);
    return null;
  }
  const bytes = readFileSync(path);
  if (bytes.length > MAX_JSON_BYTES) throw new Error(`${path}: ${bytes.length} bytes, more than ${MAX_JSON_BYTES} for a JSON or template file`);
  return bytes.toString("utf8");
}

function readJson(dir: string, file: string, required: boolean): unknown {
  const text = readText(dir, file, required);
  if (text === null) return null;
  const path = join(dir, file);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path}: not valid JSON (${e instanceof Error ? e.message : String(e)})`);
  }
}

/** config.json's spec, without touching the weights. */
export function hfFolderSpec(dir: string, maxSeqLen?: number): ModelSpec {
  return hfModelSpec(readJson(dir, "config.json", true), basename(dir), maxSeqLen);
}

/** The folder's tokenizer files, parsed; tokenizer.json is required (tokenizer.model alone is not read). */
export function hfTokenizerSource(dir: string): TokenizerSource {
  if (!existsSync(join(dir, "tokenizer.json"))) {
    const sp = existsSync(join(dir, "tokenizer.model")) ? " (only tokenizer.model, a SentencePiece file, is there)" : "";
    throw new Error(`${dir}: tokenizer.json is missing${sp}; the tokenizer is read from tokenizer.json`);
  }
  const config = readJson(dir, "config.json", true) as Record<string, unknown>;
  return {
    kind: "hf",
    dir,
    tokenizerJson: readJson(dir, "tokenizer.json", true),
    tokenizerConfig: readJson(dir, "tokenizer_config.json", false),
    generationConfig: readJson(dir, "generation_config.json", false),
    configEosIds: idList(config.eos_token_id),
    configBosId: typeof config.bos_token_id === "number" ? config.bos_token_id : null,
    chatTemplateFile: readText(dir, "chat_template.jinja", false),
    chatTemplateJson: readJson(dir, "chat_template.json", false),
  };
}

/**
 * The folder's tensors: model.safetensors, or every shard model.safetensors.index.json's
 * weight_map names (each mapped once; a name listed but absent from its shard is an error).
 */
export function hfTensorSource(dir: string): TensorSource & { totalBytes: number } {
  const index = readJson(dir, "model.safetensors.index.json", false);
  const byName = new Map<string, RawTensor>();
  let totalBytes = 0;
  const load = (file: string) => {
    const bytes = mapFileBytes(join(dir, file));
    totalBytes += bytes.length;
    return parseSafetensors(bytes, join(dir, file));
  };
  if (index === null) {
    for (const [n, t] of load("model.safetensors")) byName.set(n, t);
  } else {
    const map = (index as { weight_map?: unknown }).weight_map;
    if (typeof map !== "object" || map === null) throw new Error(`${dir}: model.safetensors.index.json has no weight_map object`);
    const shards = new Map<string, Map<string, RawTensor>>();
    for (const [name, file] of Object.entries(map as Record<string, unknown>)) {
      // Shard names come from the file: only plain file names inside this folder.
      if (typeof file !== "string" || !/^[\w.-]+\.safetensors$/.test(file) || file.startsWith(".")) {
        throw new Error(`${dir}: model.safetensors.index.json maps ${quote(name)} to ${quote(file)}, not a .safetensors file name in the folder`);
      }
      if (!shards.has(file)) shards.set(file, load(file));
      const t = shards.get(file)!.get(name);
      if (!t) throw new Error(`${dir}: model.safetensors.index.json maps ${quote(name)} to ${quote(file)}, which does not hold it`);
      byName.set(name, t);
    }
    for (const [file, tensors] of shards) {
      for (const n of tensors.keys()) if (!byName.has(n)) throw new Error(`${dir}: ${file} holds ${n}, which model.safetensors.index.json does not list`);
    }
  }
  return { names: () => byName.keys(), get: (n) => byName.get(n), totalBytes };
}
