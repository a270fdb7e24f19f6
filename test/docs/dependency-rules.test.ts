import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

// ARCHITECTURE.md's table of rooms ("folder | imports (of ours) | never imports") and the
// rules `npm run lint:deps` enforces (.dependency-cruiser.cjs, one `room-<folder>` rule per
// row) say the same thing: a folder named in a row's imports is allowed by its rule, one
// named in its "never imports" is not, and a row that lists its imports (rather than "the
// floors below") allows exactly those.

const REPO = join(import.meta.dir, "..", "..");
const FOLDERS = readFileSync(join(REPO, "ARCHITECTURE.md"), "utf8").match(/^\| `src\/.*$/gm) ?? [];
type Rule = { name: string; to: { pathNot?: string[] } };
const rules: Rule[] = createRequire(import.meta.url)(join(REPO, ".dependency-cruiser.cjs")).forbidden;
const ROOM_NAMES = readdirSync(join(REPO, "src"), { withFileTypes: true })
  .filter((d) => d.isDirectory())
  .map((d) => d.name);
/** Sub-rooms with a row of their own (`model/compute`): every folder a row of the table names under a room. */
const SUB_ROOMS = FOLDERS.flatMap((row) => [...row.matchAll(/`src\/([a-z-]+\/[a-z-]+)\/`/g)].map((m) => m[1]!));

function named(cell: string): string[] {
  const subs = SUB_ROOMS.filter((f) => cell.includes(f));
  const rest = subs.reduce((c, f) => c.replaceAll(f, ""), cell);
  return [...subs, ...ROOM_NAMES.filter((f) => new RegExp(`(^|[\\s,\`/])${f}([\\s,\`/]|$)`).test(rest))];
}

test("every row of the rooms table is one dependency rule", () => {
  expect(FOLDERS.length).toBeGreaterThan(10);
  const seen = new Set<string>();
  for (const row of FOLDERS) {
    const [, who, imports, never] = row.split("|").map((c) => c.trim());
    const folders = [...who!.matchAll(/`src\/([a-z-]+(?:\/[a-z-]+)?)\/`/g)].map((m) => m[1]!);
    if (folders.includes("cli")) continue; // the wiring may import anything
    const name = `room-${folders.join("-").replace("/", "-")}`;
    const rule = rules.find((r) => r.name === name);
    expect({ row: folders, rule: rule?.name }).toEqual({ row: folders, rule: name });
    seen.add(rule!.name);
    const allowed = (rule!.to.pathNot ?? []).map((p) => /^\^src\/([a-z-]+(?:\/[a-z-]+)?)\/$/.exec(p)?.[1]).filter((f): f is string => f !== undefined);
    const toImport = named(imports!).filter((f) => !folders.includes(f));
    const others = [...ROOM_NAMES, ...SUB_ROOMS].filter((f) => !folders.includes(f) && !toImport.includes(f) && !folders.some((g) => f.startsWith(`${g}/`)));
    const forbidden = never!.includes("any other folder") ? others : named(never!);
    expect({ row: folders, missing: toImport.filter((f) => !allowed.includes(f)) }).toEqual({ row: folders, missing: [] });
    expect({ row: folders, allowedButNever: forbidden.filter((f) => allowed.includes(f)) }).toEqual({ row: folders, allowedButNever: [] });
    if (!/below/.test(imports!)) expect({ row: folders, allowed: allowed.sort() }).toEqual({ row: folders, allowed: toImport.sort() });
  }
  const rooms = rules.filter((r) => r.name.startsWith("room-")).map((r) => r.name);
  expect(rooms.filter((r) => !seen.has(r))).toEqual([]);
});
