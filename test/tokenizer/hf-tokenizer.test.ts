import { describe, expect, test } from "bun:test";
import { Tokenizer as HfLib } from "@huggingface/tokenizers";
import { buildTokenizer } from "../../src/tokenizer/build-tokenizer.ts";
import { tokenizerFingerprint } from "../../src/tokenizer/tokenizer-fingerprint.ts";
import { ByteTokenizer, StreamDecoder, type Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import type { TokenizerSource } from "../../src/tokenizer/tokenizer-source.ts";
import { byteLevelGgufMeta, byteLevelTokenizerJson, spmGgufMeta, spmTokenizerJson, type ByteLevelOptions } from "../support/tokenizer-files.ts";

const hfSource = (tokenizerJson: unknown, tokenizerConfig: unknown = null, more: Partial<Extract<TokenizerSource, { kind: "hf" }>> = {}): TokenizerSource => ({
  kind: "hf",
  dir: "/models/test",
  tokenizerJson,
  tokenizerConfig,
  generationConfig: null,
  configEosIds: [],
  configBosId: null,
  ...more,
});

const QWEN: ByteLevelOptions = { pre: "qwen2", bos: false };
const LLAMA3: ByteLevelOptions = { pre: "llama-bpe", bos: true };
const SMOLLM: ByteLevelOptions = { pre: "smollm", bos: false };

async function qwenLike(): Promise<Tokenizer> {
  const { json } = byteLevelTokenizerJson(QWEN);
  return (await buildTokenizer(hfSource(json, { bos_token: null, eos_token: "<|im_end|>", add_bos_token: false }))).tokenizer;
}

async function spmLike(): Promise<Tokenizer> {
  return (await buildTokenizer(hfSource(spmTokenizerJson().json, { bos_token: "<s>", eos_token: "</s>", add_bos_token: true }))).tokenizer;
}

/** Every id pushed through a StreamDecoder: the pieces, then the flush. */
function stream(tok: Tokenizer, ids: readonly number[], prev = -1): { pieces: string[]; rest: string } {
  const sd = new StreamDecoder(tok, prev);
  const pieces = ids.map((id) => sd.push(id));
  return { pieces, rest: sd.flush() };
}

const TEXTS = ["hello world", "Hello world!", "hello  world\n\nhello", "x 😀 y😀", "héllo 世界 123 1234", "  leading and trailing  ", "it's 'LL done"];

describe("tokenizer.json through @huggingface/tokenizers", () => {
  test("byte level bpe round trip", async () => {
    const tok = await qwenLike();
    const { json } = byteLevelTokenizerJson(QWEN);
    const lib = new HfLib(json, {});
    expect(tok.bos).toBe(-1);
    expect(tok.addBos).toBe(false);
    expect(tok.eosIds).toEqual([tok.eos]);
    expect(tok.eosToken).toBe("<|im_end|>");
    // Merges apply: " world" is one token, "hello" one token.
    const ids = tok.encode("hello world");
    expect(ids.length).toBe(2);
    for (const text of TEXTS) {
      const enc = tok.encode(text);
      expect(enc).toEqual(lib.encode(text, { add_special_tokens: false }).ids);
      expect(tok.decode(enc)).toBe(text);
      expect(tok.decode(enc)).toBe(lib.decode(enc, { clean_up_tokenization_spaces: false }));
    }
    // Special tokens in the text are one id each and decode to nothing, as with skip_special_tokens.
    const chat = tok.encode("<|im_start|>user\nhello<|im_end|>");
    expect(chat[0]).toBe(tok.encode("<|im_start|>")[0]!);
    expect(chat.at(-1)).toBe(tok.eos);
    expect(tok.decode(chat)).toBe("user\nhello");
  });

  test("byte level bpe bos from post processor", async () => {
    const { json } = byteLevelTokenizerJson(LLAMA3);
    // No add_bos_token: tokenizer.json's TemplateProcessing says BOS goes first.
    const tok = (await buildTokenizer(hfSource(json, { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" }))).tokenizer;
    expect(tok.addBos).toBe(true);
    expect(tok.bosToken).toBe("<|begin_of_text|>");
    const ids = tok.encode("hello");
    expect(ids[0]).toBe(tok.bos);
    expect(tok.encode("hello", { bos: false })).toEqual(ids.slice(1));
    expect(tok.decode(ids)).toBe("hello");
  });

  test("eos ids gathered from every file", async () => {
    const { json, tokens } = byteLevelTokenizerJson(LLAMA3);
    const id = (t: string) => tokens.indexOf(t);
    const src = hfSource(
      json,
      { bos_token: { content: "<|begin_of_text|>" }, eos_token: "<|eot_id|>", add_bos_token: true },
      { generationConfig: { eos_token_id: [id("<|end_of_text|>"), id("<|eot_id|>")] }, configEosIds: [id("<|end_of_text|>")] },
    );
    const tok = (await buildTokenizer(src)).tokenizer;
    expect(tok.eos).toBe(id("<|eot_id|>"));
    expect([...tok.eosIds].sort()).toEqual([id("<|eot_id|>"), id("<|end_of_text|>")].sort());
    // Without tokenizer_config.json, generation_config's list gives them all, config.json the BOS.
    const bare = (
      await buildTokenizer(
        hfSource(json, null, { generationConfig: { eos_token_id: [id("<|end_of_text|>"), id("<|eot_id|>")] }, configBosId: id("<|begin_of_text|>") }),
      )
    ).tokenizer;
    expect(bare.eos).toBe(id("<|end_of_text|>"));
    expect(bare.eosIds).toEqual([id("<|end_of_text|>"), id("<|eot_id|>")]);
    expect(bare.bos).toBe(id("<|begin_of_text|>"));
  });

  test("sentencepiece byte fallback round trip", async () => {
    const tok = await spmLike();
    const lib = new HfLib(spmTokenizerJson().json, {});
    expect(tok.bos).toBe(1);
    expect(tok.eos).toBe(2);
    expect(tok.addBos).toBe(true);
    const ids = tok.encode("hello world");
    expect(ids).toEqual([1, lib.token_to_id("▁hello")!, lib.token_to_id("▁world")!]);
    for (const text of ["hello world", "Hello world!", "héllo 😀 世", "a\nb", "hello"]) {
      const enc = tok.encode(text);
      expect(enc).toEqual(lib.encode(text).ids);
      expect(tok.decode(enc)).toBe(text);
      expect(tok.decode(enc)).toBe(lib.decode(enc, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
    }
    // é and 😀 are not pieces: they fall back to their UTF-8 bytes.
    const e = tok.encode("é", { bos: false });
    expect(e.map((i) => (tok as unknown as { tokenOf(id: number): string }).tokenOf(i))).toEqual(["▁", "<0xC3>", "<0xA9>"]);
  });

  test("metaspace tokenizer json decodes like sentencepiece", async () => {
    // Mistral v0.3 style: Metaspace pre-tokenizer and decoder instead of Prepend/Replace/Strip.
    const meta = { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false };
    const json = { ...spmTokenizerJson().json, normalizer: null, pre_tokenizer: meta, decoder: meta };
    const tok = (await buildTokenizer(hfSource(json, { bos_token: "<s>", eos_token: "</s>" }))).tokenizer;
    const ref = await spmLike();
    for (const text of ["hello world", "Hello world!", "héllo 😀 世"]) {
      expect(tok.encode(text)).toEqual(ref.encode(text));
      expect(tok.decode(tok.encode(text))).toBe(text);
      const s = stream(tok, tok.encode(text));
      expect(s.pieces.join("") + s.rest).toBe(text);
    }
  });

  test("sentencepiece leading space after bos", async () => {
    const tok = await spmLike();
    const hello = tok.encode("hello", { bos: false })[0]!;
    const world = tok.encode("world", { bos: false })[0]!;
    // The first word's prefix space goes after BOS (or at the start), stays anywhere else.
    expect(tok.decodeToken(hello, tok.bos)).toBe("hello");
    expect(tok.decodeToken(hello, -1)).toBe("hello");
    expect(tok.decodeToken(world, hello)).toBe(" world");
    expect(stream(tok, [world], hello).pieces).toEqual([" world"]);
  });

  test("streaming never emits replacement mid character", async () => {
    const tok = await qwenLike();
    // " 😀" is [" \xF0", "\x9F", "\x98\x80"]: the emoji is cut twice.
    const ids = tok.encode("a 😀b");
    expect(ids.length).toBe(5);
    const { pieces, rest } = stream(tok, ids);
    expect(pieces).toEqual(["a", " ", "", "😀", "b"]);
    expect(rest).toBe("");
    for (const t of [await qwenLike(), await spmLike()]) {
      for (const text of ["x 😀 y😀", "héllo 世界", "😀😀 😀"]) {
        const s = stream(t, t.encode(text));
        expect(s.pieces.some((p) => p.includes("\uFFFD"))).toBe(false);
        expect(s.pieces.join("") + s.rest).toBe(text);
      }
    }
  });

  test("streaming flush of a cut character", async () => {
    const tok = await qwenLike();
    const ids = tok.encode(" 😀");
    // Stop after the first two pieces: the held bytes come out as one U+FFFD at flush, never before.
    const { pieces, rest } = stream(tok, ids.slice(0, 2));
    expect(pieces).toEqual([" ", ""]);
    expect(rest).toBe("\uFFFD");
    // Invalid UTF-8 from the model (a lone continuation byte) is replaced where it stands.
    const lone = tok.encode("\u0080", { bos: false }).slice(1);
    const s = stream(tok, [...lone, ...tok.encode("ok")]);
    expect(s.pieces.join("") + s.rest).toBe("\uFFFDok");
    const spm = await spmLike();
    const cut = spm.encode("世界", { bos: false });
    const t = stream(spm, cut.slice(0, -1));
    expect(t.pieces.every((p) => !p.includes("\uFFFD"))).toBe(true);
    expect(t.rest).toBe("\uFFFD");
  });
});

describe("GGUF vocabularies on the same tokenizer classes", () => {
  for (const opts of [QWEN, LLAMA3, SMOLLM]) {
    test(`gguf gpt2 ${opts.pre} equals tokenizer json`, async () => {
      const { json } = byteLevelTokenizerJson(opts);
      const cfg = opts.bos ? { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>", add_bos_token: true } : { bos_token: null, eos_token: "<|im_end|>" };
      const fromJson = (await buildTokenizer(hfSource(json, cfg))).tokenizer;
      const meta = byteLevelGgufMeta(opts);
      const fromGguf = (await buildTokenizer({ kind: "gguf", file: "/models/test.gguf", meta })).tokenizer;
      expect(fromGguf.vocabSize).toBe(fromJson.vocabSize);
      expect(fromGguf.eos).toBe(fromJson.eos);
      expect(fromGguf.addBos).toBe(opts.bos);
      for (const text of [...TEXTS, "<|im_start|>user\nhi 12345<|im_end|>", "<|begin_of_text|>hello<|eot_id|>"]) {
        expect(fromGguf.encode(text)).toEqual(fromJson.encode(text));
        expect(fromGguf.decode(fromGguf.encode(text))).toBe(fromJson.decode(fromJson.encode(text)));
      }
    });
  }

  test("gguf llama equals tokenizer json", async () => {
    const fromJson = await spmLike();
    const fromGguf = (await buildTokenizer({ kind: "gguf", file: "/models/test.gguf", meta: spmGgufMeta() })).tokenizer;
    expect(fromGguf.bos).toBe(1);
    expect(fromGguf.eos).toBe(2);
    for (const text of ["hello world", "Hello world!", "héllo 😀 世", "hellohello worldworld", " hello  world ", "<s>hello</s>"]) {
      expect(fromGguf.encode(text)).toEqual(fromJson.encode(text));
      expect(fromGguf.decode(fromGguf.encode(text))).toBe(text.replaceAll("<s>", "").replaceAll("</s>", ""));
    }
  });

  test("gguf llama3 end of turn tokens end generation", async () => {
    const meta = byteLevelGgufMeta(LLAMA3);
    const tok = (await buildTokenizer({ kind: "gguf", file: "/m.gguf", meta })).tokenizer;
    // eos_token_id names <|eot_id|>; <|end_of_text|> is a control token llama.cpp also stops on.
    expect(tok.eos).toBe(meta.tokens.indexOf("<|eot_id|>"));
    expect(tok.eosIds).toContain(meta.tokens.indexOf("<|end_of_text|>"));
  });
});

describe("tokenizer refusals", () => {
  test("unsupported gguf tokenizer model refused", async () => {
    for (const model of ["bert", "t5", "rwkv"]) {
      const meta = { ...spmGgufMeta(), model };
      await expect(buildTokenizer({ kind: "gguf", file: "/models/x.gguf", meta })).rejects.toThrow(
        `/models/x.gguf: GGUF tokenizer model "${model}" (tokenizer.ggml.model) is not supported; supported: "llama", "gpt2"`,
      );
    }
  });

  test("unsupported gguf pre tokenizer refused", async () => {
    const meta = { ...byteLevelGgufMeta(QWEN), pre: "tekken" };
    await expect(buildTokenizer({ kind: "gguf", file: "/m.gguf", meta })).rejects.toThrow(
      /GGUF pre-tokenizer "tekken" \(tokenizer.ggml.pre\) is not supported; supported: default, gpt-2, mpt, llama-bpe/,
    );
  });

  test("gguf vocab inconsistencies refused", async () => {
    const meta = spmGgufMeta();
    await expect(buildTokenizer({ kind: "gguf", file: "/m.gguf", meta: { ...meta, scores: [1, 2] } })).rejects.toThrow(
      `/m.gguf: tokenizer.ggml.scores has 2 entries for ${meta.tokens.length} tokens`,
    );
    await expect(buildTokenizer({ kind: "gguf", file: "/m.gguf", meta: { ...meta, eosId: 99999 } })).rejects.toThrow(
      /tokenizer.ggml.eos_token_id = 99999 outside the vocabulary/,
    );
    await expect(buildTokenizer({ kind: "gguf", file: "/m.gguf", meta: { ...byteLevelGgufMeta(QWEN), merges: null } })).rejects.toThrow(
      /"gpt2" needs tokenizer.ggml.merges/,
    );
  });

  test("malformed tokenizer json refused", async () => {
    await expect(buildTokenizer(hfSource([1, 2]))).rejects.toThrow("/models/test: tokenizer.json is malformed: want a JSON object");
    await expect(buildTokenizer(hfSource({ version: "1.0" }))).rejects.toThrow('/models/test: tokenizer.json is malformed: no "model" object');
    await expect(buildTokenizer(hfSource({ model: { type: "BPE" } }))).rejects.toThrow('tokenizer.json is malformed: model has no "vocab"');
    await expect(buildTokenizer(hfSource({ model: { type: "WordLevel", vocab: {} } }))).rejects.toThrow(
      'tokenizer.json model type "WordLevel" is not supported (supported: BPE, Unigram, WordPiece)',
    );
    const { json } = byteLevelTokenizerJson(QWEN);
    await expect(buildTokenizer(hfSource(json, { eos_token: "<nope>" }))).rejects.toThrow('/models/test: eos_token "<nope>" is not in the vocabulary');
    await expect(buildTokenizer(hfSource(json, { bos_token: null }))).rejects.toThrow(/no EOS token/);
    await expect(buildTokenizer(hfSource(json, { eos_token: "<|im_end|>" }, { generationConfig: { eos_token_id: "x" } }))).rejects.toThrow(
      /generation_config.json eos_token_id must be a token id/,
    );
  });
});

describe("tokenizer fingerprint", () => {
  test("fingerprint tells tokenizers apart", async () => {
    const qwen = await qwenLike();
    const same = await qwenLike();
    const fp = tokenizerFingerprint(qwen);
    expect(fp).toMatch(/^[0-9a-f]{16}$/);
    expect(tokenizerFingerprint(same)).toBe(fp);
    // Same vocabulary, another pre-tokenizer (digits split differently): other ids for the probe.
    const { json } = byteLevelTokenizerJson(QWEN);
    const gpt2 = (
      await buildTokenizer(
        hfSource(
          { ...json, pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true } },
          { bos_token: null, eos_token: "<|im_end|>" },
        ),
      )
    ).tokenizer;
    expect(tokenizerFingerprint(gpt2)).not.toBe(fp);
    expect(tokenizerFingerprint(await spmLike())).not.toBe(fp);
    expect(tokenizerFingerprint(new ByteTokenizer())).not.toBe(fp);
  });
});
