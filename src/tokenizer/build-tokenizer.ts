import { ggufTokenizerFiles } from "./gguf-vocab.ts";
import { HfTokenizer } from "./hf-tokenizer.ts";
import { loadLlama2cTokenizer } from "./llama2c-tokenizer.ts";
import { ByteTokenizer, type Tokenizer } from "./tokenizer.ts";
import type { TokenizerSource } from "./tokenizer-source.ts";
import { quote } from "../codec/index.ts";

/** A model's tokenizer and its own chat template (null: it ships none; the caller falls back to the default). */
export interface BuiltTokenizer {
  tokenizer: Tokenizer;
  chatTemplate: string | null;
}

/** Turns what a loader found into a Tokenizer: the byte vocabulary, tokenizer.bin, tokenizer.json, or a GGUF vocabulary. */
export async function buildTokenizer(src: TokenizerSource): Promise<BuiltTokenizer> {
  switch (src.kind) {
    case "byte":
      return { tokenizer: new ByteTokenizer(), chatTemplate: null };
    case "llama2c":
      return { tokenizer: loadLlama2cTokenizer(src.path, src.vocabSize), chatTemplate: null };
    case "hf":
      return buildHf(src);
    case "gguf": {
      const files = ggufTokenizerFiles(src.meta, src.file);
      const tokenizer = new HfTokenizer(files.tokenizerJson, {
        origin: src.file,
        bos: files.bos,
        eos: files.eos,
        extraEosIds: files.extraEosIds,
        addBos: files.addBos,
      });
      return { tokenizer, chatTemplate: src.meta.chatTemplate };
    }
  }
}

type HfSource = Extract<TokenizerSource, { kind: "hf" }>;

function buildHf(src: HfSource): BuiltTokenizer {
  const cfg = asRecord(src.tokenizerConfig);
  const gen = asRecord(src.generationConfig);
  const origin = src.dir;
  const extraEosIds = [...idList(gen.eos_token_id, `${origin}/generation_config.json eos_token_id`), ...src.configEosIds];
  const bos =
    "bos_token" in cfg ? tokenText(cfg.bos_token, `${origin}/tokenizer_config.json bos_token`) : (idList(gen.bos_token_id, "bos")[0] ?? src.configBosId);
  const eos = "eos_token" in cfg ? tokenText(cfg.eos_token, `${origin}/tokenizer_config.json eos_token`) : (extraEosIds[0] ?? null);
  const addBos = typeof cfg.add_bos_token === "boolean" ? cfg.add_bos_token : null;
  const tokenizer = new HfTokenizer(src.tokenizerJson, { origin, bos, eos, extraEosIds, addBos });
  return { tokenizer, chatTemplate: hfChatTemplate(src, cfg) };
}

/**
 * The folder's template, in transformers' order: chat_template.jinja clobbers tokenizer_config's
 * chat_template; chat_template.json (a processor's file, which transformers' tokenizer ignores)
 * is the last resort, so a folder that ships only it still gets its own template.
 */
function hfChatTemplate(src: HfSource, cfg: Record<string, unknown>): string | null {
  if (src.chatTemplateFile != null) return src.chatTemplateFile;
  const own = chatTemplateOf(cfg.chat_template, `${src.dir}/tokenizer_config.json`);
  if (own !== null || src.chatTemplateJson == null) return own;
  return chatTemplateOf(asRecord(src.chatTemplateJson).chat_template ?? null, `${src.dir}/chat_template.json`);
}

function asRecord(v: unknown): Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
}

/** bos_token / eos_token: a string, an AddedToken object ({ content }), or null. */
function tokenText(v: unknown, what: string): string | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v;
  const content = asRecord(v).content;
  if (typeof content === "string") return content;
  throw new Error(`${what} must be a string, {"content": ...} or null, got ${quote(v)}`);
}

/** eos_token_id: one id or a list (Llama 3's generation_config.json). */
function idList(v: unknown, what: string): number[] {
  if (v === null || v === undefined) return [];
  const list = Array.isArray(v) ? v : [v];
  for (const id of list) if (!Number.isInteger(id) || (id as number) < 0) throw new Error(`${what} must be a token id or a list of them, got ${quote(v)}`);
  return list as number[];
}

/** chat_template: a string, or a list of named templates of which "default" is the chat one. */
function chatTemplateOf(v: unknown, file: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v === "string") return v;
  if (Array.isArray(v)) {
    const named = v.map(asRecord);
    const t = named.find((n) => n.name === "default") ?? named[0];
    if (t && typeof t.template === "string") return t.template;
  }
  throw new Error(`${file} chat_template must be a string or a list of {name, template}, got ${quote(v)}`);
}
