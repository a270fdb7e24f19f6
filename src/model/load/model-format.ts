import { closeSync, existsSync, openSync, readdirSync, readSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { GGUF_MAGIC } from "./gguf.ts";
import { parseLlama2cHeader } from "./llama2c.ts";

/** What `--model PATH` points at, decided from the path's kind and the file's first bytes. */
export type ModelFormat = { kind: "hf"; dir: string; shards: string[] } | { kind: "gguf"; file: string } | { kind: "llama2c"; file: string };

export const SUPPORTED_FORMATS =
  "supported: a Hugging Face model folder (config.json + model.safetensors or sharded *.safetensors with model.safetensors.index.json), a GGUF file (v2/v3), a llama2.c .bin checkpoint (with --tokenizer tokenizer.bin)";

/** Thrown when the path is not a model this engine reads: names the file, what it looks like, what would work. */
export class ModelFormatError extends Error {}

const refuse = (path: string, looksLike: string) => new ModelFormatError(`--model ${path}: ${looksLike}; ${SUPPORTED_FORMATS}`);

export function detectModelFormat(path: string): ModelFormat {
  if (!existsSync(path)) throw new ModelFormatError(`--model ${path}: no such file or directory`);
  if (statSync(path).isDirectory()) return detectFolder(path);
  const size = statSync(path).size;
  const head = readHead(path, 64);
  const u32 = head.length >= 4 ? new DataView(head.buffer).getUint32(0, true) : -1;
  if (u32 === GGUF_MAGIC) return { kind: "gguf", file: path };
  // A legacy llama2.c file has no magic; its header implying the exact file length is the
  // strongest sign there is, so it is tried before the guesses below.
  let llama2c: string;
  try {
    const h = parseLlama2cHeader(head, basename(path));
    if (h.fileBytes === size) return { kind: "llama2c", file: path };
    llama2c = `as a llama2.c checkpoint its header [${h.raw.join(", ")}] implies ${h.fileBytes} bytes, the file has ${size}`;
  } catch (e) {
    if (e instanceof Error && e.message.includes("ak42"))
      throw refuse(path, "a versioned llama2.c export ('ak42' header; only legacy version-0 files are read)");
    llama2c = "its first bytes are no llama2.c header either";
  }
  const looks = lookOf(path, head, size);
  if (looks !== null) throw refuse(path, looks);
  if (looksLikeTokenizerBin(head, size)) throw refuse(path, "a llama2.c tokenizer.bin, not a model (pass it as --tokenizer, the checkpoint as --model)");
  throw refuse(path, `not a recognized model file (${llama2c})`);
}

function detectFolder(dir: string): ModelFormat {
  const files = readdirSync(dir);
  if (!files.includes("config.json")) {
    const gguf = files.filter((f) => f.endsWith(".gguf"));
    const hint =
      gguf.length > 0
        ? ` (it holds ${gguf.slice(0, 3).join(", ")}: pass that file)`
        : files.includes("snapshots")
          ? " (a Hugging Face cache entry: pass its snapshots/<revision> folder, or download with --local-dir)"
          : "";
    throw refuse(dir, `a directory without config.json${hint}`);
  }
  if (files.includes("model.safetensors.index.json")) return { kind: "hf", dir, shards: [] };
  if (files.includes("model.safetensors")) return { kind: "hf", dir, shards: ["model.safetensors"] };
  const shards = files.filter((f) => /^model-\d+-of-\d+\.safetensors$/.test(f));
  if (shards.length > 0) throw refuse(dir, `sharded safetensors (${shards[0]}, ...) without model.safetensors.index.json`);
  const pickles = files.filter((f) => /^pytorch_model.*\.bin$|\.pt$|\.pth$/.test(f));
  if (pickles.length > 0) throw refuse(dir, `a Hugging Face folder with only PyTorch pickle weights (${pickles[0]}); convert them to safetensors`);
  throw refuse(dir, "a folder with config.json but no model.safetensors");
}

function readHead(path: string, n: number): Uint8Array {
  const fd = openSync(path, "r");
  try {
    const buf = new Uint8Array(n);
    const got = readSync(fd, buf, 0, n, 0);
    return buf.subarray(0, got).slice();
  } finally {
    closeSync(fd);
  }
}

/** What a file that is not a loadable model looks like, or null when it may be a llama2.c checkpoint. */
function lookOf(path: string, head: Uint8Array, size: number): string | null {
  const text = (a: number, b: number) => String.fromCharCode(...head.subarray(a, b));
  if (size === 0) return "an empty file";
  if (text(0, 4) === "PK\x03\x04") return "a PyTorch pickle (a zip archive, as torch.save writes)";
  if (head[0] === 0x80 && head[1]! >= 2 && head[1]! <= 5) return "a PyTorch pickle";
  if (["lmgg", "fmgg", "tjgg", "algg", "GGML", "GGJT"].includes(text(0, 4))) return "a legacy GGML file (before GGUF; convert it to GGUF)";
  if (isSafetensors(head, size)) {
    const folder = dirname(path);
    const hint = existsSync(join(folder, "config.json"))
      ? `; pass its folder ${folder}`
      : "; it needs config.json (and tokenizer.json) beside it in a Hugging Face folder";
    return `a bare safetensors file${hint}`;
  }
  if (/^\s*[{[]/.test(text(0, Math.min(head.length, 16)))) return jsonLook(path, size);
  return null;
}

function isSafetensors(head: Uint8Array, size: number): boolean {
  if (head.length < 9) return false;
  const n = new DataView(head.buffer).getBigUint64(0, true);
  return n > 1n && n <= BigInt(size - 8) && head[8] === 0x7b; // '{'
}

function jsonLook(path: string, size: number): string {
  if (size > 64 * 1024 * 1024) return "a JSON file, not a model";
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder().decode(readHead(path, size)));
  } catch {
    return "a text file that is not valid JSON, not a model";
  }
  const o = (typeof doc === "object" && doc !== null ? doc : {}) as Record<string, unknown>;
  if ("model" in o && ("added_tokens" in o || "pre_tokenizer" in o || "normalizer" in o))
    return "a tokenizer.json, not a model (pass the folder holding it and the weights)";
  if ("model_type" in o || "architectures" in o) return "a Hugging Face config.json (pass the folder holding it)";
  if ("weight_map" in o) return "a safetensors index (pass the folder holding it)";
  return "a JSON file, not a model";
}

/** tokenizer.bin: int32 max_token_length, then (f32 score, int32 len <= max, bytes) entries. */
function looksLikeTokenizerBin(head: Uint8Array, size: number): boolean {
  if (head.length < 12) return false;
  const dv = new DataView(head.buffer);
  const maxLen = dv.getInt32(0, true);
  const len = dv.getInt32(8, true);
  return maxLen > 0 && maxLen <= 1024 && len >= 0 && len <= maxLen && 12 + len <= size && Number.isFinite(dv.getFloat32(4, true));
}
