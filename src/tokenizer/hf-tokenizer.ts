import assert from "node:assert";
import { Tokenizer as HfLibTokenizer } from "@huggingface/tokenizers";
import { byteLevelBytes } from "./byte-level.ts";
import type { EncodeOptions, Tokenizer } from "./tokenizer.ts";
import { withUnicodeDigits } from "./unicode-digits.ts";
import { quote } from "../codec/index.ts";

/** What the tokenizer files say beside tokenizer.json, resolved by the builder. */
export interface HfTokenizerOptions {
  /** Where the tokenizer came from (a folder, a GGUF file), for error messages. */
  origin: string;
  /** BOS and EOS as token text (tokenizer_config's bos_token / eos_token) or id (config.json), or null. */
  bos: string | number | null;
  eos: string | number | null;
  /** Ids that also end generation (generation_config.json, config.json). */
  extraEosIds: readonly number[];
  /** tokenizer_config's add_bos_token; null: what tokenizer.json's post-processor does. */
  addBos: boolean | null;
}

/** How a token's text turns into the bytes it stands for, from tokenizer.json's decoder. */
type PieceStyle = "byte-level" | "metaspace" | "generic";

const SUPPORTED_MODELS = ["BPE", "Unigram", "WordPiece"];
const EMPTY = new Uint8Array(0);
const utf8 = new TextEncoder();

/**
 * A tokenizer.json run by @huggingface/tokenizers, seen through the engine's Tokenizer. Encoding
 * is the library's; decoding is by exact per-token bytes (the byte-level alphabet, or SentencePiece's
 * ▁ and <0xXX> byte-fallback pieces), so a stream can cut inside a character and StreamDecoder
 * stitches it. Special tokens decode to nothing, as with skip_special_tokens.
 */
export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bos: number;
  readonly eos: number;
  readonly eosIds: readonly number[];
  readonly addBos: boolean;
  readonly bosToken?: string;
  readonly eosToken?: string;
  private readonly lib: HfLibTokenizer;
  /** Per id, its bytes; ids the vocabulary skips (and special tokens) have none. */
  private readonly pieces: Uint8Array[];
  /** The decoder drops the space SentencePiece prepends to the first word. */
  private readonly stripsFirstSpace: boolean;

  constructor(tokenizerJson: unknown, opts: HfTokenizerOptions) {
    checkShape(tokenizerJson, opts.origin);
    try {
      this.lib = new HfLibTokenizer(withUnicodeDigits(tokenizerJson as object), {});
    } catch (e) {
      throw new Error(`${opts.origin}: tokenizer.json is malformed: ${(e as Error).message}`);
    }
    const vocab = this.lib.get_vocab(true);
    let maxId = -1;
    for (const id of vocab.values()) maxId = Math.max(maxId, id);
    if (maxId < 0) throw new Error(`${opts.origin}: tokenizer.json has an empty vocabulary`);
    this.vocabSize = maxId + 1;
    const json = tokenizerJson as { decoder?: unknown; model: { byte_fallback?: unknown } };
    const { style, stripsFirstSpace } = pieceStyleOf(json.decoder);
    this.stripsFirstSpace = stripsFirstSpace;
    this.pieces = this.buildPieces(style, json.model.byte_fallback === true || style === "metaspace");

    this.bos = opts.bos === null ? -1 : this.idOf(opts.bos, "bos_token", opts.origin);
    const eosIds = opts.eos === null ? [] : [this.idOf(opts.eos, "eos_token", opts.origin)];
    for (const id of opts.extraEosIds) if (!eosIds.includes(id)) eosIds.push(id);
    for (const id of eosIds) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize)
        throw new Error(`${opts.origin}: eos token id ${id} is outside the vocabulary 0..${this.vocabSize - 1}`);
    }
    if (eosIds.length === 0)
      throw new Error(`${opts.origin}: no EOS token (tokenizer_config.json eos_token, generation_config.json or config.json eos_token_id)`);
    this.eos = eosIds[0]!;
    this.eosIds = eosIds;
    const bosText = this.bos >= 0 ? this.lib.id_to_token(this.bos) : undefined;
    const eosText = this.lib.id_to_token(this.eos);
    if (bosText !== undefined) this.bosToken = bosText;
    if (eosText !== undefined) this.eosToken = eosText;
    this.addBos = this.bos >= 0 && (opts.addBos ?? this.postProcessorAddsBos());
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const ids = this.lib.encode(text, { add_special_tokens: false }).ids;
    if ((opts.bos ?? this.addBos) && this.bos >= 0) ids.unshift(this.bos);
    if (opts.eos) ids.push(this.eos);
    return ids;
  }

  decode(ids: readonly number[]): string {
    const chunks: Uint8Array[] = [];
    let n = 0;
    let prev = -1;
    for (const id of ids) {
      const p = this.pieceBytes(id, prev);
      chunks.push(p);
      n += p.length;
      prev = id;
    }
    const all = new Uint8Array(n);
    let at = 0;
    for (const c of chunks) {
      all.set(c, at);
      at += c.length;
    }
    return new TextDecoder("utf-8").decode(all);
  }

  /** Ids past the vocabulary but inside the model's (padded embedding rows) decode to nothing. */
  pieceBytes(id: number, prev = -1): Uint8Array {
    assert(Number.isInteger(id) && id >= 0, `token ${id} is not a token id`);
    const p = this.pieces[id] ?? EMPTY;
    if (this.stripsFirstSpace && (prev === -1 || prev === this.bos) && p[0] === 0x20) return p.subarray(1);
    return p;
  }

  decodeToken(id: number, prev = -1): string {
    return new TextDecoder("utf-8").decode(this.pieceBytes(id, prev));
  }

  /** The token string of `id` as tokenizer.json spells it (e.g. "Ġworld", "▁world"), or undefined. */
  tokenOf(id: number): string | undefined {
    return this.lib.id_to_token(id);
  }

  private idOf(token: string | number, what: string, origin: string): number {
    if (typeof token === "number") {
      if (!Number.isInteger(token) || token < 0 || token >= this.vocabSize)
        throw new Error(`${origin}: ${what} id ${token} is outside the vocabulary 0..${this.vocabSize - 1}`);
      return token;
    }
    const id = this.lib.token_to_id(token);
    if (id === undefined) throw new Error(`${origin}: ${what} ${quote(token)} is not in the vocabulary`);
    return id;
  }

  /** Whether tokenizer.json's post-processor puts the BOS id first (Llama's TemplateProcessing does, Qwen's ByteLevel does not). */
  private postProcessorAddsBos(): boolean {
    const ids = this.lib.encode("a", { add_special_tokens: true }).ids;
    return ids[0] === this.bos && ids.length > this.lib.encode("a", { add_special_tokens: false }).ids.length;
  }

  private buildPieces(style: PieceStyle, byteFallback: boolean): Uint8Array[] {
    const added = this.lib.get_added_tokens_decoder();
    const pieces: Uint8Array[] = new Array(this.vocabSize);
    for (let id = 0; id < this.vocabSize; id++) {
      const a = added.get(id);
      if (a) {
        pieces[id] = a.special ? EMPTY : utf8.encode(a.content);
        continue;
      }
      const token = this.lib.id_to_token(id);
      if (token === undefined) continue;
      pieces[id] =
        style === "generic"
          ? this.genericPiece(id)
          : style === "byte-level"
            ? (byteLevelBytes(token) ?? utf8.encode(token))
            : metaspacePiece(token, byteFallback);
    }
    return pieces;
  }

  /** Decoders other than byte-level and SentencePiece's: the library's text of the token alone (lossy for split characters). */
  private genericPiece(id: number): Uint8Array {
    return utf8.encode(this.lib.decode([id], { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
  }
}

const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;
const BYTE_PIECES: Uint8Array[] = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));

function metaspacePiece(token: string, byteFallback: boolean): Uint8Array {
  const m = byteFallback ? BYTE_PIECE.exec(token) : null;
  if (m) return BYTE_PIECES[parseInt(m[1]!, 16)]!;
  return utf8.encode(token.replaceAll("▁", " "));
}

/**
 * Reads the decoder the way tokenizers applies it: ByteLevel maps the alphabet back to bytes;
 * Metaspace, or Replace(▁ → space) with ByteFallback, is SentencePiece, whose first word loses
 * its prefix space (Metaspace's prepend scheme, or a Strip of one leading character).
 */
function pieceStyleOf(decoder: unknown): { style: PieceStyle; stripsFirstSpace: boolean } {
  const d = (decoder ?? {}) as { type?: string; decoders?: unknown[] };
  const parts = (d.type === "Sequence" ? (d.decoders ?? []) : [d]) as Record<string, unknown>[];
  const types = parts.map((p) => p?.type);
  if (types.includes("ByteLevel")) return { style: "byte-level", stripsFirstSpace: false };
  const meta = parts.find((p) => p?.type === "Metaspace");
  if (meta) {
    const scheme = meta.prepend_scheme ?? (meta.add_prefix_space === false ? "never" : "always");
    return { style: "metaspace", stripsFirstSpace: scheme !== "never" };
  }
  const replacesMeta = parts.some((p) => p?.type === "Replace" && (p.pattern as { String?: string })?.String === "▁" && p.content === " ");
  if (replacesMeta) {
    const strip = parts.some((p) => p?.type === "Strip" && Number(p.start) >= 1);
    return { style: "metaspace", stripsFirstSpace: strip };
  }
  return { style: "generic", stripsFirstSpace: false };
}

function checkShape(json: unknown, origin: string): void {
  const bad = (why: string) => new Error(`${origin}: tokenizer.json is malformed: ${why}`);
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw bad("want a JSON object");
  const model = (json as { model?: unknown }).model;
  if (typeof model !== "object" || model === null) throw bad('no "model" object');
  const type = (model as { type?: unknown }).type;
  // Old files omit model.type; the library infers BPE from merges, so only a named type is checked.
  if (type !== undefined && !SUPPORTED_MODELS.includes(String(type))) {
    throw new Error(`${origin}: tokenizer.json model type ${quote(type)} is not supported (supported: ${SUPPORTED_MODELS.join(", ")})`);
  }
  const vocab = (model as { vocab?: unknown }).vocab;
  if (typeof vocab !== "object" || vocab === null) throw bad('model has no "vocab"');
  const added = (json as { added_tokens?: unknown }).added_tokens;
  if (added !== undefined && added !== null && !Array.isArray(added)) throw bad('"added_tokens" is not an array');
}
