import { afterAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { alive, descendantsOf, exitWithin, killAll, killTree, spawnProc, waitGone, type Proc } from "./procs.ts";

// A cluster is a tree of processes; whatever stops its top (a supervisor's SIGTERM, a
// closed terminal's SIGHUP, an OOM killer's SIGKILL), no engine may be left behind.

afterAll(killAll);

/** The pids of the engines and the gateway, as the cluster lists them once it serves. */
async function enginePids(p: Proc): Promise<number[]> {
  await p.waitLine((l) => l.startsWith("serving;"), 45_000);
  return p.lines.filter((l) => /^\s+(gateway|prefill|decode)\s/.test(l)).map((l) => Number(/ pid (\d+)/.exec(l)![1]));
}

const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
const argAfter = (args: string[], flag: string) => (args.includes(flag) ? args[args.indexOf(flag) + 1] : undefined);

test("sigterm to npm start stops the whole tree", async () => {
  // Exactly what a user (or `timeout`, or a supervisor) runs: npm → sh → bun cluster → 4 engines.
  const npm = spawnProc(["npm", "start", "--silent"]);
  let tree: number[] = [];
  try {
    const pids = await enginePids(npm);
    expect(pids.length).toBe(4);
    tree = descendantsOf(npm.proc.pid);
    for (const pid of pids) expect(tree).toContain(pid);
    npm.proc.kill("SIGTERM");
    expect(await waitGone([npm.proc.pid, ...tree], 10_000)).toEqual([]);
  } finally {
    // Orphans are nobody's children any more: kill them by pid.
    for (const pid of [npm.proc.pid, ...descendantsOf(npm.proc.pid), ...tree]) killTree(pid);
  }
}, 60_000);

test("sighup stops the cluster and its engines", async () => {
  const c = spawnProc([process.execPath, "bin/engine.ts", "cluster", "--decode", "1"]);
  try {
    const pids = await enginePids(c);
    expect(pids.length).toBe(3);
    c.proc.kill("SIGHUP");
    expect(await exitWithin(c.proc, 20_000)).toBe(0);
    expect(await waitGone(pids, 10_000)).toEqual([]);
    expect(c.lines).toContain("stopping...");
  } finally {
    killTree(c.proc.pid);
  }
}, 60_000);

async function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

test("engines exit when the cluster is killed and got every option", async () => {
  const front = `127.0.0.1:${await freeLoopbackPort()}`;
  const c = spawnProc([
    process.execPath,
    "bin/engine.ts",
    "cluster",
    "--decode",
    "1",
    "--http-listen",
    front,
    "--max-batch-tokens",
    "64",
    "--drain-timeout-s",
    "3",
    "--num-blocks",
    "512",
  ]);
  let pids: number[] = [];
  try {
    pids = await enginePids(c);
    const [gateway, ...engines] = pids as [number, ...number[]];
    // The options reached the processes they concern.
    expect(c.lines.find((l) => l.trim().startsWith("gateway"))).toContain(`http ${front}`);
    const gw = cmdline(gateway);
    expect([argAfter(gw, "--http-listen"), argAfter(gw, "--drain-timeout-s"), argAfter(gw, "--max-batch-tokens")]).toEqual([front, "3", undefined]);
    for (const pid of engines) {
      const args = cmdline(pid);
      expect([argAfter(args, "--max-batch-tokens"), argAfter(args, "--drain-timeout-s"), argAfter(args, "--num-blocks")]).toEqual(["64", "3", "512"]);
    }
    // SIGKILL: the cluster cannot tell anyone; its children notice on their own.
    c.proc.kill("SIGKILL");
    await c.proc.exited;
    expect(await waitGone(pids, 5_000)).toEqual([]);
    for (const pid of pids) expect(alive(pid)).toBe(false);
  } finally {
    // Orphans are no longer the cluster's children: kill them by pid.
    for (const pid of [c.proc.pid, ...pids]) killTree(pid);
  }
}, 60_000);
