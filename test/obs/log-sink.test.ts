// In-process servers under test log to .test-logs/engine.log (test/setup.ts), not to the runner's
// output: lines like "model thread died" from a test that kills the thread on purpose read as
// failures there.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { log } from "../../src/obs/index.ts";

test("test logs go to the log file", () => {
  const marker = `probe-${process.pid}-${Date.now()}`;
  log.error("model thread died", { marker });
  const file = readFileSync(join(import.meta.dir, "..", "..", ".test-logs", "engine.log"), "utf8");
  const line = file.split("\n").find((l) => l.includes(marker));
  expect(JSON.parse(line!)).toMatchObject({ level: "error", msg: "model thread died", marker });
});
