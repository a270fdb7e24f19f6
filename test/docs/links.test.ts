import { expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";

// A clone is complete: every file the documents link to or name exists in the repo, and
// none of them sends the reader outside it.

const REPO = join(import.meta.dir, "..", "..");
const DOCS = [
  "README.md",
  "ARCHITECTURE.md",
  ...readdirSync(join(REPO, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`),
];
const TOP = ["src", "test", "docs", "deploy", "bench", "proto", "parity", "scripts", "bin", "tools"];

test("docs links and named paths exist", () => {
  for (const doc of DOCS) {
    const text = readFileSync(join(REPO, doc), "utf8");
    const missing: string[] = [];
    for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^(https?:|mailto:|#)/.test(target!)) continue;
      const path = join(REPO, dirname(doc), target!.replace(/#.*$/, ""));
      if (!existsSync(path)) missing.push(`link ${target}`);
    }
    // `src/...`-style names in backticks: a file or folder that must be there (globs and brace lists aside).
    for (const [, name] of text.matchAll(new RegExp(`\`((?:${TOP.join("|")})/[^\`\\s]*)\``, "g"))) {
      if (/[*{]/.test(name!)) continue;
      if (!existsSync(join(REPO, name!.replace(/[:#].*$/, "")))) missing.push(`path ${name}`);
    }
    expect({ doc, missing }).toEqual({ doc, missing: [] });
  }
});

test("docs never send the reader outside the repo", () => {
  const files = [...DOCS, "buf.yaml", "parity/kv.wire.v1/manifest.json", ...["kv", "engine", "control"].map((p) => `proto/tl/${p}/v1/${p}.proto`)];
  for (const file of files) {
    const text = readFileSync(join(REPO, file), "utf8");
    expect({ file, outside: text.match(/\.\.\/shared|shared\/spec|shared\/design/g) ?? [] }).toEqual({ file, outside: [] });
  }
});

// Code and documents cite the contracts by file and section: `kv-block.md, "Block hash"`,
// `docs/grpc-services.md "KV events"`, `[..](docs/data-plane.md#rules)`. Every such file must
// exist, and a quoted section or an anchor must name one of its headings (a heading that
// starts with the quoted words), so a renamed contract or section leaves no comment behind.

const CITING = ["src", "test", "bench", "bin", "scripts", "tools", "proto", "docs"];
const CITING_FILES = [
  "README.md",
  "ARCHITECTURE.md",
  ...CITING.flatMap((dir) =>
    (readdirSync(join(REPO, dir), { recursive: true }) as string[])
      .filter((f) => /\.(ts|mjs|cjs|js|proto|md)$/.test(f) && !f.includes("node_modules"))
      .map((f) => `${dir}/${f}`),
  ),
];

function headings(file: string): string[] {
  return (readFileSync(file, "utf8").match(/^#+ .*$/gm) ?? []).map((h) => h.replace(/^#+ /, "").trim());
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-");
}

/** The cited document, or null: a path from the citing file or the repo root, or a bare name in docs/ or the root. */
function resolveDoc(from: string, cited: string): string | null {
  const candidates = cited.includes("/")
    ? [join(REPO, dirname(from), cited), join(REPO, cited)]
    : [join(REPO, dirname(from), cited), join(REPO, "docs", cited), join(REPO, cited)];
  return candidates.find((c) => existsSync(c)) ?? null;
}

test("every doc the code and docs cite exists with the section named", () => {
  const missing: string[] = [];
  let checked = 0;
  for (const file of CITING_FILES) {
    const text = readFileSync(join(REPO, file), "utf8");
    for (const m of text.matchAll(/(?<![A-Za-z0-9_./-])([A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md)(?![A-Za-z0-9])(#[a-z0-9-]+)?(?:,? "([^"\n]+)")?/g)) {
      const [, cited, anchor, section] = m;
      if (/^https?:|\*/.test(cited!) || /[{}$]/.test(cited!)) continue;
      // Another project's path (gRPC's doc/...): its first folder is none of ours.
      const first = cited!.replace(/^(\.\.?\/)+/, "").split("/")[0]!;
      if (cited!.includes("/") && !existsSync(join(REPO, first)) && !existsSync(join(REPO, dirname(file), first))) continue;
      checked++;
      const doc = resolveDoc(file, cited!);
      if (doc === null) {
        missing.push(`${file}: ${cited}`);
        continue;
      }
      const hs = headings(doc);
      if (anchor !== undefined && !hs.some((h) => `#${slug(h)}` === anchor)) missing.push(`${file}: ${cited}${anchor}`);
      if (section !== undefined && !hs.some((h) => h.toLowerCase().startsWith(section.toLowerCase()))) missing.push(`${file}: ${cited} "${section}"`);
    }
  }
  expect(checked).toBeGreaterThan(50);
  expect(missing).toEqual([]);
});
