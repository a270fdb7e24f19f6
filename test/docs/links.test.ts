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

test("docs_links_and_named_paths_exist", () => {
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

test("docs_never_send_the_reader_outside_the_repo", () => {
  const files = [...DOCS, "buf.yaml", "parity/kv.wire.v1/manifest.json", ...["kv", "engine", "control"].map((p) => `proto/tl/${p}/v1/${p}.proto`)];
  for (const file of files) {
    const text = readFileSync(join(REPO, file), "utf8");
    expect({ file, outside: text.match(/\.\.\/shared|shared\/spec|shared\/design/g) ?? [] }).toEqual({ file, outside: [] });
  }
});
