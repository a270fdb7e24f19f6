// Every value an error message quotes from a file or a request goes through quote(): bounded, and
// with nothing a terminal would obey. Then the places that quote: a GGUF file's metadata key,
// value and tensor name, a safetensors header, and an HTTP request's fields.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { quote, QUOTE_MAX } from "../../src/codec/index.ts";
import { parseGguf } from "../../src/model/load/gguf.ts";
import { parseSafetensors } from "../../src/model/load/safetensors.ts";
import { readModelFiles } from "../../src/model/load/load-model.ts";
import { syntheticWeights } from "../../src/model/compute/weights.ts";
import { encodeGguf, encodeGgufModel, GT } from "../support/model-writers.ts";
import { fakeServedModel } from "../support/nodes.ts";
import { CKPT } from "../model/format-helpers.ts";

const ESC = "\u001b";
const HOSTILE = `${ESC}[31m${"k".repeat(200_000)}`;

/** A message is safe to print: short, no control or format character a terminal would act on. */
function expectSafe(message: string, within = 400): void {
  expect(message.length).toBeLessThan(within);
  const unsafe = [...message].filter((c) => {
    const n = c.codePointAt(0)!;
    return n < 0x20 || (n >= 0x7f && n <= 0x9f) || (n >= 0x202a && n <= 0x202e) || (n >= 0x2066 && n <= 0x2069);
  });
  expect(unsafe).toEqual([]);
}

describe("quote", () => {
  test("short strings are JSON-quoted; other values as they print", () => {
    expect(quote("abc")).toBe('"abc"');
    expect(quote(12.5)).toBe("12.5");
    expect(quote(null)).toBe("null");
    expect(quote(undefined)).toBe("undefined");
    expect(quote(7n)).toBe("7");
    expect(quote([1, "a"])).toBe('[1,"a"]');
    expect(quote({ a: 1n })).toBe('{"a":"1"}');
  });

  test("long values are cut to QUOTE_MAX characters and say how long they were", () => {
    const q = quote("x".repeat(200_000));
    expect(q).toBe(`"${"x".repeat(QUOTE_MAX)}"… (200000 characters)`);
    expect(quote(Array(100_000).fill(1)).length).toBeLessThan(QUOTE_MAX + 40);
  });

  test("control and format characters are escaped: ESC, DEL, C1's CSI, bidi overrides, line separators", () => {
    expect(quote(`${ESC}[31mred`)).toBe('"\\u001b[31mred"');
    expect(quote("a\u007fb\u009bc\u202ed\u2028e\u2066f")).toBe('"a\\u007fb\\u009bc\\u202ed\\u2028e\\u2066f"');
    expect(quote({ k: `${ESC}\u009b` })).toBe('{"k":"\\u001b\\u009b"}');
    // Other text is kept as it is.
    expect(quote("Äpfel ½ 中文")).toBe('"Äpfel ½ 中文"');
  });

  test("a cut through a surrogate pair leaves an escaped half, never a broken string", () => {
    const q = quote(`${"a".repeat(QUOTE_MAX - 1)}😀tail`);
    expect(q.startsWith(`"${"a".repeat(QUOTE_MAX - 1)}\\ud83d"`)).toBe(true);
  });
});

describe("files", () => {
  test("GGUF: a 200 KB metadata key with an ANSI escape, in a bad bool's error", () => {
    const bytes = encodeGguf([[HOSTILE, GT.bool, true]], []);
    // The bool's one byte follows the key and its u32 type: 2 is no bool.
    const at = findAfter(bytes, new TextEncoder().encode("k".repeat(16)), 0) + 4;
    expect(bytes[at]).toBe(1);
    bytes[at] = 2;
    const e = catchError(() => parseGguf(bytes, "bad.gguf"));
    expect(e).toContain("bool is 2");
    expect(e).toContain("(200005 characters)");
    expectSafe(e);
  });

  test("GGUF: a 200 KB tensor name, and a 200 KB general.architecture value", () => {
    const named = encodeGguf([], [{ name: HOSTILE, type: "f32", shape: [4], data: new Float32Array(4) }]);
    const withBadDims = patchTensorDims(named, HOSTILE, 9);
    const e1 = catchError(() => parseGguf(withBadDims, "t.gguf"));
    expect(e1).toContain("dimensions");
    expectSafe(e1);

    const dir = mkdtempSync(join(tmpdir(), "tl-quote-"));
    try {
      const file = join(dir, "arch.gguf");
      writeFileSync(file, encodeGgufModel(CKPT, syntheticWeights(CKPT, 1), { extraKvs: [["general.architecture", GT.str, HOSTILE]] }));
      const e2 = catchError(() => readModelFiles(file));
      expect(e2).toContain("general.architecture");
      expectSafe(e2, 600);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("safetensors: a tensor name and dtype from the header", () => {
    const header = JSON.stringify({ [HOSTILE]: { dtype: `${ESC}[2J${"Q".repeat(100_000)}`, shape: [1], data_offsets: [0, 4] } });
    const h = new TextEncoder().encode(header);
    const bytes = new Uint8Array(8 + h.length + 4);
    new DataView(bytes.buffer).setBigUint64(0, BigInt(h.length), true);
    bytes.set(h, 8);
    const e = catchError(() => parseSafetensors(bytes, "model.safetensors"));
    expect(e).toContain("dtype");
    expectSafe(e);
  });
});

describe("requests", () => {
  let E: EngineNode;
  beforeAll(async () => {
    E = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 64, maxModelLen: 300 });
  });
  afterAll(() => E?.shutdown());

  test("each field a client names or fills comes back bounded and escaped in the 400", async () => {
    const big = `${ESC}]0;pwned${"\u0007"}${"v".repeat(1_000_000)}`;
    const bodies: Record<string, unknown>[] = [
      { prompt: "x", seed: big },
      { prompt: "x", temperature: big },
      { prompt: "x", max_tokens: big },
      { prompt: "x", stream: big },
      { prompt: "x", logit_bias: { [big.slice(0, 300_000)]: 1 } },
      { prompt: "x", logit_bias: { "5": big } },
      { prompt: "x", stream: true, stream_options: { [big.slice(0, 300_000)]: true } },
      { prompt: "x", service_tier: big },
      { prompt: "x", model: big },
      { prompt: [1, big] },
    ];
    for (const body of bodies) {
      const res = await fetch(`http://${E.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(body) });
      const j = (await res.json()) as { error: { message: string } };
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect(res.status).toBeLessThan(500);
      expectSafe(j.error.message);
    }
    const chat = await fetch(`http://${E.httpAddress}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ messages: [{ role: big, content: "x" }] }),
    });
    expectSafe(((await chat.json()) as { error: { message: string } }).error.message);
    const path = await fetch(`http://${E.httpAddress}/${"p".repeat(6000)}`);
    expectSafe(((await path.json()) as { error: { message: string } }).error.message);
  });
});

function catchError(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
  throw new Error("no error");
}

function findAfter(bytes: Uint8Array, needle: Uint8Array, _hint: number): number {
  // The last occurrence of the needle ends where the key ends.
  for (let i = bytes.length - needle.length; i >= 0; i--) {
    let ok = true;
    for (let j = 0; j < needle.length && ok; j++) ok = bytes[i + j] === needle[j];
    if (ok) return i + needle.length;
  }
  throw new Error("needle not found");
}

/** Sets the n_dims of the tensor named `name` (the u32 right after its name). */
function patchTensorDims(bytes: Uint8Array, name: string, dims: number): Uint8Array {
  const out = bytes.slice();
  const at = findAfter(out, new TextEncoder().encode(name.slice(-16)), 0);
  new DataView(out.buffer).setUint32(at, dims, true);
  return out;
}
