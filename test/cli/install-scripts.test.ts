// `npm install` on a clean clone prints no unexplained warning: every dependency with an install
// script is approved or denied in package.json's allowScripts (npm 11), and bun's, which puts
// its native binary in place, runs.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO } from "./procs.ts";

test("every install script is reviewed", () => {
  const pkg = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as { allowScripts?: Record<string, boolean> };
  const lock = JSON.parse(readFileSync(join(REPO, "package-lock.json"), "utf8")) as { packages: Record<string, { hasInstallScript?: boolean }> };
  const withScripts = Object.entries(lock.packages)
    .filter(([, p]) => p.hasInstallScript)
    .map(([path]) => path.slice(path.lastIndexOf("node_modules/") + "node_modules/".length));
  expect(withScripts.length).toBeGreaterThan(0);
  const reviewed = Object.keys(pkg.allowScripts ?? {});
  expect(withScripts.filter((name) => !reviewed.includes(name))).toEqual([]);
  // bun's postinstall links the platform's native binary: the test runner and `npm run build` need it.
  expect(pkg.allowScripts?.bun).toBe(true);
  expect(Object.keys(pkg.allowScripts ?? {}).filter((name) => !withScripts.includes(name))).toEqual([]);
});

test("npx engine runs from the checkout as the readme says", async () => {
  // npm install puts nothing on PATH: the README's way in is `npx engine` (package.json's bin).
  const readme = readFileSync(join(REPO, "README.md"), "utf8");
  for (const words of ["npx engine", "dist/engine", "engine --version", "Node.js 20", "npm 11"]) expect(readme).toContain(words);
  const p = Bun.spawn(["npx", "--no-install", "engine", "--version"], { cwd: REPO, stdout: "pipe", stderr: "pipe" });
  const [out, code] = [await new Response(p.stdout).text(), await p.exited];
  const pkg = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as { version: string };
  expect({ code, out }).toEqual({ code: 0, out: `engine ${pkg.version}\n` });
}, 30_000);
