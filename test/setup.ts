import { appendFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { logTo } from "../src/obs/log.ts";

// Engines and the gateway log JSON lines; tests read outcomes, not logs. Processes a test
// spawns inherit the level; the servers a test runs in this process write to
// .test-logs/engine.log instead of the runner's output, so a test that kills a model thread or
// refuses a peer on purpose prints nothing that reads like a failure (and the lines are still
// there to read when something does fail).
process.env.TL_LOG_LEVEL ??= "error";
const dir = join(import.meta.dir, "..", ".test-logs");
mkdirSync(dir, { recursive: true });
const file = join(dir, "engine.log");
logTo((line) => appendFileSync(file, line));
