import { describe, expect, test } from "bun:test";
import { ByteTokenizer, StreamDecoder } from "../../src/tokenizer/index.ts";

describe("byte tokenizer", () => {
  const tok = new ByteTokenizer();

  test("byte tokenizer round trip", () => {
    expect(tok.vocabSize).toBe(258);
    expect(tok.encode("hi")).toEqual([256, 104, 105]);
    expect(tok.encode("hi", { bos: false, eos: true })).toEqual([104, 105, 257]);
    const text = "héllo, 世界 🌍\n";
    expect(tok.decode(tok.encode(text, { eos: true }))).toBe(text);
    expect(() => tok.decode([258])).toThrow(/outside/);
  });

  test("byte tokenizer utf8 streaming decode", () => {
    const text = "aé世🌍z";
    const ids = tok.encode(text);
    const sd = new StreamDecoder(tok);
    const pieces = ids.map((id) => sd.push(id));
    // No replacement characters mid-stream: partial characters are held back.
    expect(pieces.join("")).toBe(text);
    expect(pieces.some((p) => p.includes("\uFFFD"))).toBe(false);
    // 🌍 is 4 bytes: three empty pieces, then the whole character.
    const at = ids.indexOf(0xf0);
    expect(pieces.slice(at, at + 4)).toEqual(["", "", "", "🌍"]);
    expect(sd.flush()).toBe("");
    // A stream cut mid-character gives one replacement character at flush, not garbage before.
    expect(sd.push(0xe4)).toBe("");
    expect(sd.flush()).toBe("\uFFFD");
    // Per-token decoding alone cannot do this, which is why StreamDecoder exists.
    expect(tok.decodeToken(0xe4)).toBe("\uFFFD");
  });
});
