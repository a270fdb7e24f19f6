import { describe, expect, test } from "bun:test";
import { checkConstraint, ConstraintCompiler, ConstraintError, constraintHash, type ConstraintSpec } from "../../src/grammar/index.ts";
import { grammarVocab } from "../../src/tokenizer/index.ts";
import { loadTokenizerFor } from "../../src/model/index.ts";
import { applyTokenBitmask } from "../../src/rng/index.ts";

const { tokenizer } = await loadTokenizerFor({ modelPath: "" });
const compiler = await ConstraintCompiler.create(grammarVocab(tokenizer));

/** Walks the grammar taking, at each step, the allowed token a fixed pseudo-random pick lands on; returns the text. */
async function walk(spec: ConstraintSpec, steps = 200, seed = 1): Promise<{ text: string; ended: boolean }> {
  const m = await compiler.matcher(await compiler.compile(spec));
  const mask = new Int32Array(m.words);
  const logits = new Float32Array(tokenizer.vocabSize);
  const ids: number[] = [];
  let s = seed;
  try {
    for (let i = 0; i < steps && !m.terminated; i++) {
      logits.fill(0);
      m.fillMask(mask);
      const allowed = applyTokenBitmask(logits, mask);
      expect(allowed).toBeGreaterThan(0);
      const finite = [...logits.keys()].filter((k) => logits[k] === 0);
      s = (s * 1103515245 + 12345) >>> 0;
      // Prefer ending once the grammar allows it, so walks stay short.
      const eos = finite.find((t) => tokenizer.eosIds.includes(t));
      const t = eos ?? finite[s % finite.length]!;
      expect(m.accept(t)).toBe(true);
      ids.push(t);
    }
    return { text: tokenizer.decode(ids), ended: m.terminated };
  } finally {
    m.dispose();
  }
}

describe("ConstraintCompiler on the embedded model's vocabulary", () => {
  test("a JSON schema's walk is valid JSON of that shape", async () => {
    const schema = {
      type: "object",
      properties: { n: { type: "integer", minimum: 0, maximum: 99 }, ok: { type: "boolean" } },
      required: ["n", "ok"],
      additionalProperties: false,
    };
    const { text, ended } = await walk({ kind: "json_schema", source: JSON.stringify(schema) });
    expect(ended).toBe(true);
    const v = JSON.parse(text) as { n: number; ok: boolean };
    expect(Object.keys(v)).toEqual(["n", "ok"]);
    expect(Number.isInteger(v.n) && v.n >= 0 && v.n <= 99).toBe(true);
    expect(typeof v.ok).toBe("boolean");
  });

  test("regex, choice and GBNF walks match", async () => {
    for (let seed = 1; seed < 4; seed++) {
      expect((await walk({ kind: "regex", source: "[0-9]{3}-[a-z]{2}" }, 50, seed)).text).toMatch(/^[0-9]{3}-[a-z]{2}$/);
      expect(["yes", "no", "maybe"]).toContain((await walk({ kind: "choice", source: '["yes","no","maybe"]' }, 50, seed)).text);
      expect((await walk({ kind: "grammar", source: 'root ::= "(" [a-c]+ ")"' }, 50, seed)).text).toMatch(/^\([a-c]+\)$/);
    }
  });

  test("a grammar that does not compile is a ConstraintError with xgrammar's reason, and the compiler still works after", async () => {
    await expect(compiler.compile({ kind: "grammar", source: "root ::= foo" })).rejects.toThrow(/does not compile: .*Rule "foo" is not defined/);
    await expect(compiler.compile({ kind: "regex", source: "[0-9" })).rejects.toThrow(ConstraintError);
    expect((await walk({ kind: "choice", source: '["a"]' })).text).toBe("a");
  });

  test("a schema keyword the backend cannot enforce is refused by name", () => {
    for (const kw of ["not", "oneOf", "if", "uniqueItems", "multipleOf", "patternProperties"]) {
      const schema = { type: "object", properties: { a: { type: "integer", [kw]: kw === "uniqueItems" ? true : kw === "multipleOf" ? 2 : {} } } };
      expect(() => checkConstraint({ kind: "json_schema", source: JSON.stringify(schema) })).toThrow(`"${kw}"`);
    }
    expect(() => checkConstraint({ kind: "json_schema", source: JSON.stringify({ type: "string", format: "color" }) })).toThrow('"format"');
    // A request's text in a message: quoted, cut, and no control or format character left raw.
    const hostile = JSON.stringify({ type: "object", properties: { "\u001b[2J\u202e": { type: "string", ["\u0007x".repeat(40)]: 1 } } });
    let message = "";
    try {
      checkConstraint({ kind: "json_schema", source: hostile });
    } catch (e) {
      message = (e as Error).message;
    }
    expect(message).toContain("\\u001b[2J\\u202e");
    expect([...message].filter((c) => c.charCodeAt(0) < 0x20 || c === "\u202e")).toEqual([]);
    expect(message.length).toBeLessThan(400);
  });

  test("the hash is the kind and the source's, compiled once", async () => {
    const a: ConstraintSpec = { kind: "regex", source: "a+" };
    expect(constraintHash(a)).toMatch(/^[0-9a-f]{32}$/);
    expect(constraintHash(a)).not.toBe(constraintHash({ kind: "grammar", source: "a+" }));
    expect(await compiler.compile(a)).toBe(await compiler.compile({ ...a }));
  });
});

describe("TokenMatcher.fillMask reads the mask straight from xgrammar's memory", () => {
  test("it is the library's own mask at every step, on a 49,152-token vocabulary, while memory grows", async () => {
    const encoded = ["", ...Array.from({ length: 256 }, (_, b) => String.fromCodePoint(b < 33 || (b > 126 && b < 161) || b === 173 ? 256 + b : b))];
    let s = 7;
    const alphabet = 'abcdefghij {}[]":,0123456789';
    while (encoded.length < 49152) {
      let p = "";
      for (let i = 0, n = 2 + ((s = (s * 1103515245 + 12345) >>> 0) % 6); i < n; i++) p += alphabet[(s = (s * 1103515245 + 12345) >>> 0) % alphabet.length];
      encoded.push(p.replaceAll(" ", "Ġ"));
    }
    const big = await ConstraintCompiler.create({ encoded, stopIds: [0] });
    const c = await big.compile({
      kind: "json_schema",
      source: JSON.stringify({ type: "object", properties: { a: { type: "string" }, b: { type: "array", items: { type: "integer" } } } }),
    });
    const held: { dispose(): void }[] = [];
    const m = await big.matcher(c);
    const mine = new Int32Array(m.words);
    const theirs = (m as unknown as { matcher: { getNextTokenBitmask(): Promise<Int32Array> } }).matcher;
    for (let step = 0; step < 60 && !m.terminated; step++) {
      // Other matchers allocate meanwhile, so the instance's memory may grow under the reader.
      for (let k = 0; k < 20; k++) held.push(await big.matcher(c));
      m.fillMask(mine);
      const want = await theirs.getNextTokenBitmask();
      expect(Array.from(mine)).toEqual(Array.from(want));
      const allowed: number[] = [];
      for (let i = 0; i < 49152; i++) if ((mine[i >> 5]! >>> (i & 31)) & 1) allowed.push(i);
      s = (s * 1103515245 + 12345) >>> 0;
      const t = allowed.includes(0) && step > 30 ? 0 : allowed[s % allowed.length]!;
      expect(m.accept(t)).toBe(true);
    }
    for (const h of held) h.dispose();
    m.dispose();
  });
});
