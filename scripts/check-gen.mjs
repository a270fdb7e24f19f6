// Fails when src/gen/ is not what `buf generate` makes from proto/ right now.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const out = mkdtempSync(join(tmpdir(), "tl-gen-"));
const template = readFileSync("buf.gen.yaml", "utf8").replace("out: src/gen", `out: ${out}`);
const tmpl = join(out, "..", `${out.split("/").pop()}.buf.gen.yaml`);
writeFileSync(tmpl, template);
try {
  execFileSync("npx", ["buf", "generate", "--template", tmpl], { stdio: "inherit" });
  const list = (dir) =>
    readdirSync(dir).flatMap((n) => {
      const p = join(dir, n);
      return statSync(p).isDirectory() ? list(p) : [p];
    });
  const want = new Map(list(out).map((p) => [relative(out, p), readFileSync(p, "utf8")]));
  const have = new Map(list("src/gen").map((p) => [relative("src/gen", p), readFileSync(p, "utf8")]));
  const stale = [...new Set([...want.keys(), ...have.keys()])].filter((k) => want.get(k) !== have.get(k));
  if (stale.length > 0) {
    console.error(`src/gen is stale (run npm run gen): ${stale.join(", ")}`);
    process.exit(1);
  }
} finally {
  rmSync(out, { recursive: true, force: true });
  rmSync(tmpl, { force: true });
}
