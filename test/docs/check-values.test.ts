import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { crc32c, f16Bytes, fnv1a64, promptHashes, writeEnvelope } from "../../src/codec/index.ts";
import { type ConstraintKind, constraintHash } from "../../src/grammar/index.ts";
import { Pcg32, resumeRng, stream } from "../../src/rng/index.ts";

// The check values our contract documents state are the ones the code computes: every row
// of each "Check values" table is evaluated, and a row this test cannot read fails it.

const DOCS = join(import.meta.dir, "..", "..", "docs");
const utf8 = (s: string) => new TextEncoder().encode(s);
const hex = (n: bigint | number, width: number) => `0x${n.toString(16).padStart(width, "0")}`;
const times = <T>(n: number, f: () => T) => Array.from({ length: n }, f);

/** How each documented expression is computed, keyed by its shape. */
const EVALUATORS: [RegExp, (m: RegExpExecArray) => string][] = [
  [/^fnv1a64\("(.*)"\)$/, (m) => hex(fnv1a64(utf8(m[1]!)), 16)],
  [/^crc32c\("(.*)"\)$/, (m) => hex(crc32c(utf8(m[1]!)), 8)],
  [
    /^blockHashes\(B=(\d+), \[([\d, ]+)\]\)$/,
    (m) =>
      promptHashes(m[2]!.split(", ").map(Number), Number(m[1]))
        .map((h) => hex(h, 16))
        .join(", "),
  ],
  [
    /^pcg32\((\d+), (\d+)\)\.next_u32 × (\d+)$/,
    (m) => {
      const r = Pcg32.seeded(BigInt(m[1]!), BigInt(m[2]!));
      return times(Number(m[3]), () => hex(r.nextU32(), 8)).join(", ");
    },
  ],
  [
    /^stream\((\d+), "(\w+)"\)\.next_u32 × (\d+)$/,
    (m) => {
      const r = stream(BigInt(m[1]!), m[2]!);
      return times(Number(m[3]), () => hex(r.nextU32(), 8)).join(", ");
    },
  ],
  [
    /^stream\((\d+), "(\w+)"\)\.uniform_f64 × (\d+)$/,
    (m) => {
      const r = stream(BigInt(m[1]!), m[2]!);
      return times(Number(m[3]), () => String(r.uniformF64())).join(", ");
    },
  ],
  [/^resume_rng\((\d+), (\d+)\)\.uniform_f64$/, (m) => String(resumeRng(BigInt(m[1]!), Number(m[2])).uniformF64())],
  // The source is written as a JSON string literal's body.
  [/^constraint_hash\((\w+), "(.*)"\)$/, (m) => constraintHash({ kind: m[1] as ConstraintKind, source: JSON.parse(`"${m[2]}"`) as string })],
];

/** The `| `expression` | `value` |` rows of a document's "## Check values" (or "### Check values") section. */
function checkRows(file: string): { expression: string; value: string }[] {
  const text = readFileSync(join(DOCS, file), "utf8");
  const section = text.slice(text.indexOf("# Check values") - 1);
  const body = section.slice(0, section.indexOf("\n## ", 3) < 0 ? undefined : section.indexOf("\n## ", 3));
  return [...body.matchAll(/^\| `([^`]+)` \| `([^`]+)` \|$/gm)].map((m) => ({ expression: m[1]!, value: m[2]! }));
}

function evaluate(expression: string): string {
  for (const [re, f] of EVALUATORS) {
    const m = re.exec(expression);
    if (m) return f(m);
  }
  throw new Error(`no evaluator for the documented expression ${expression}`);
}

for (const [file, least] of [
  ["kv-block.md", 5],
  ["random-stream.md", 5],
  ["http-handoff.md", 3],
] as const) {
  test(`docs_${file.replace(/\W/g, "_")}_check_values_are_what_the_code_computes`, () => {
    const rows = checkRows(file);
    expect(rows.length).toBeGreaterThanOrEqual(least);
    for (const { expression, value } of rows) expect({ expression, value: evaluate(expression) }).toEqual({ expression, value });
  });
}

test("docs kv block worked example is the envelope the codec writes", () => {
  const text = readFileSync(join(DOCS, "kv-block.md"), "utf8");
  const example = text.slice(text.indexOf("## Worked example"));
  const dump = [...example.matchAll(/^ {4}((?:[0-9a-f]{2} ?)+)$/gm)].map((m) => m[1]!.trim()).join(" ");
  // B = 2, L = 1, H = 1, D = 2; tokens [1, 2]; K then V, each [slot][dim].
  const payload = f16Bytes(new Float16Array([1, 2, 3, 4, 0.5, -1, 0, 0.25]));
  const [hash] = promptHashes([1, 2], 2);
  const env = writeEnvelope({ version: 1, dtype: 1, nBlocks: 1, blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 }, [{ hash: hash!, nTokens: 2, payload }]);
  expect(dump).toBe(Array.from(env, (b) => b.toString(16).padStart(2, "0")).join(" "));
  expect(/CRC is\s+(0x[0-9a-f]{8})/.exec(example)?.[1]).toBe(hex(crc32c(env.subarray(0, env.length - 4)), 8));
});
