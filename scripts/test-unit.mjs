// `npm run test:unit`: the pure core's tests, without a socket or a process, for a quick
// check while working (`npm test` runs everything). A test file belongs here when it lies
// in a core room's folder and opens no socket, server, fetch or child process; that is read
// from the file itself, so a test that starts a node leaves this run by itself.
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

const CORE = ["codec", "rng", "pool", "grammar", "tokenizer", "model", "engine", "obs", "handoff", "docs", "fuzz"];
const IO =
  /Bun\.spawn|spawn(Sync)?\(|child_process|startEngineNode|startTestCluster|startGateway|startLoneGateway|Bun\.serve|Bun\.connect|Bun\.listen|serveGrpc|serveKv|node:net|node:http|fetch\(|\.listen\(|grpcClient/;

const root = join(import.meta.dirname, "..");
const files = CORE.flatMap((dir) =>
  readdirSync(join(root, "test", dir), { recursive: true })
    .filter((f) => f.endsWith(".test.ts"))
    .map((f) => join("test", dir, f)),
).filter((f) => !IO.test(readFileSync(join(root, f), "utf8")));

const run = spawnSync("bun", ["test", "--timeout", "60000", ...files.map((f) => `./${f}`)], { cwd: root, stdio: "inherit" });
process.exit(run.status ?? 1);
