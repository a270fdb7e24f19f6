import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type Role, ROLES, SPECS } from "../../src/cli/options.ts";
import { roleArgs } from "../../src/cli/spawn-role.ts";
import { DEFAULT_MODEL_NAME } from "../../src/model/load/default-model.ts";
import { transparentHugePages } from "../../src/model/compute/huge-pages.ts";
import { alive, exitWithin, killAll, killTree, REPO, spawnProc, tempDir, waitGone } from "./procs.ts";

const expected = JSON.parse(readFileSync(join(REPO, "models", DEFAULT_MODEL_NAME, "expected.json"), "utf8")) as {
  greedy: { prompt: string; completion_ids: number[] }[];
};

// One compiled binary for the whole file: the test is about what `npm run build` ships.
const dir = tempDir("tl-engine-bin-");
const bin = join(dir.path, "engine");

beforeAll(async () => {
  const t0 = performance.now();
  // What `npm run build` runs (its entry points: the engine and its model thread), into our folder.
  const script = (JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.build!;
  const args = script.split(/\s+/).slice(1);
  args[args.indexOf("--outfile") + 1] = bin;
  const build = Bun.spawn([process.execPath, ...args], { cwd: REPO, stdout: "pipe", stderr: "pipe" });
  const code = await build.exited;
  if (code !== 0) throw new Error(`bun build --compile failed (${code}):\n${await new Response(build.stderr).text()}`);
  if (process.env.TL_TEST_TIMINGS) console.log(`compiled bin/engine.ts in ${Math.round(performance.now() - t0)} ms`);
}, 120_000);

afterAll(async () => {
  await killAll();
  dir.remove();
});

/** Runs the binary to completion (a command that ends: --help, a refused config). */
async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const p = Bun.spawn([bin, ...args], { cwd: dir.path, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [out, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text()]);
  return { code: await exitWithin(p, 20_000), out, err };
}

const argsOf = (role: Role) => (role === "gateway" ? roleArgs(role) : roleArgs(role, ["--num-blocks", "64"]));

test("binary starts in each role", async () => {
  const procs = ROLES.map((role) => ({ role, p: spawnProc([bin, ...argsOf(role)], { cwd: dir.path }) }));
  try {
    for (const { role, p } of procs) {
      const ready = await p.ready();
      expect(ready.role).toBe(role);
      expect(ready.pid).toBe(p.proc.pid);
      const http = String(ready.http);
      expect(http).toMatch(/^127\.0\.0\.1:\d+$/);
      expect(http).not.toBe("127.0.0.1:0");
      const res = await fetch(`http://${http}/health`);
      // A gateway with no engine registered is alive but not ready.
      expect(res.status).toBe(role === "gateway" ? 503 : 200);
      const health = (await res.json()) as { status: string; roles?: string[]; workers?: Record<string, number> };
      expect(health.status).toBe(role === "gateway" ? "no_engines" : "ok");
      if (role === "gateway") {
        expect((await fetch(`http://${http}/health/live`)).status).toBe(200);
        expect(health.workers).toEqual({ prefill: 0, decode: 0, both: 0 });
        expect(String(ready.registry)).toMatch(/^127\.0\.0\.1:[1-9]\d*$/);
      } else {
        expect(health.roles).toEqual(role === "both" ? ["prefill", "decode"] : [role]);
        // The compiled binary carries the native CRC-32C binding, not the table fallback.
        if (process.platform === "linux" && process.arch === "x64") expect(ready.crc32c).toBe("node-rs");
        // The binary carries the model thread's entry point, and engines run the model there.
        expect(ready.model_thread).toBe("worker");
        // ... and its WebAssembly kernels: a plain-JS fallback would be said here.
        expect(ready.kernels).toBe("wasm-simd");
        expect(ready.kernel_memories).toBe(1);
        // ... with the KV pool in their memory, where attention reads it in place.
        expect(ready.kv_pool).toBe("in_kernel");
        // ... and their memory on 2 MiB pages wherever this host hands them out (huge-pages.ts).
        expect(ready.huge_pages).toBe(transparentHugePages());
        // Only roles that receive KV serve KvTransfer.
        if (role === "prefill") expect(ready.kv).toBeNull();
        else expect(String(ready.kv)).toMatch(/^127\.0\.0\.1:[1-9]\d*$/);
        const metrics = await (await fetch(`http://${http}/metrics`)).text();
        expect(metrics).toContain("# TYPE");
      }
    }
    for (const { p } of procs) p.proc.kill("SIGTERM");
    for (const { p } of procs) expect(await exitWithin(p.proc, 10_000)).toBe(0);
  } finally {
    for (const { p } of procs) p.proc.kill("SIGKILL");
  }
}, 40_000);

test("binary refuses bad config", async () => {
  const file = (name: string, text: string) => {
    const path = join(dir.path, name);
    writeFileSync(path, text);
    return path;
  };
  const cases: { args: string[]; says: string[] }[] = [
    { args: ["--config", file("unknown-key.toml", "[engine]\nblock_tokens = 16\nnum_blcks = 8\n")], says: ['unknown key "engine.num_blcks"'] },
    { args: ["--config", file("unknown-table.toml", "[engin]\nblock_tokens = 16\n")], says: ['unknown key "engin"'] },
    { args: ["--config", file("bad-int.toml", "[engine]\nblock_tokens = -4\n")], says: ["engine.block_tokens", "positive integer", "-4"] },
    { args: ["--config", file("bad-type.toml", '[engine]\nnum_blocks = "many"\n')], says: ["engine.num_blocks", '"many"'] },
    { args: ["--config", file("bad-addr.toml", '[gateway]\nhttp_listen = "localhost"\n')], says: ["gateway.http_listen", "host:port", '"localhost"'] },
    { args: ["--config", file("bad-toml.toml", "[engine\nblock_tokens = 16\n")], says: ["bad-toml.toml", "not valid TOML"] },
    { args: ["--config", join(dir.path, "missing.toml")], says: ["missing.toml"] },
    { args: ["--role", "router"], says: ["--role", '"router"', "prefill, decode, both, gateway"] },
    { args: ["--num-blocks", "0"], says: ["--num-blocks", "engine.num_blocks", "positive integer"] },
    { args: ["--kv-listen", "127.0.0.1:70000"], says: ["engine.kv_listen", "127.0.0.1:70000"] },
    { args: ["--advertise-host", "0.0.0.0"], says: ["engine.advertise_host", '"0.0.0.0"'] },
    { args: ["--no-such-flag", "1"], says: ["unknown option --no-such-flag"] },
    { args: ["--block-tokens"], says: ["--block-tokens needs a value"] },
    // A flag no option has is unknown, wherever it stands (it was "--bogus needs a value").
    { args: ["--bogus"], says: ["unknown option --bogus"] },
    { args: ["--role", "both", "--bogus"], says: ["unknown option --bogus"] },
    { args: ["cluster", "--decode", "0"], says: ["--decode", "1..16"] },
  ];
  const results = await Promise.all(cases.map((c) => run(c.args)));
  cases.forEach((c, i) => {
    const r = results[i]!;
    const what = `engine ${c.args.join(" ")}`;
    expect({ what, code: r.code }).toEqual({ what, code: 2 });
    for (const s of c.says) expect(r.err).toContain(s);
    expect(r.err).toContain("see engine --help");
    // Refused before serving: nothing announced itself as ready.
    expect(r.out).not.toContain('"msg":"ready"');
  });
}, 40_000);

test("binary says its version", async () => {
  const r = await run(["--version"]);
  const pkg = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as { version: string };
  expect({ code: r.code, out: r.out }).toEqual({ code: 0, out: `engine ${pkg.version}\n` });
});

test("binary help lists every option", async () => {
  const r = await run(["--help"]);
  expect(r.code).toBe(0);
  const lines = r.out.split("\n");
  for (const s of SPECS) {
    const flag = `--${s.key.replaceAll("_", "-")}`;
    const line = lines.find((l) => l.includes(`[${s.section}] ${s.key} `));
    expect(line, `help line for [${s.section}] ${s.key}`).toBeDefined();
    expect(line).toContain(flag);
    expect(line).toContain(`(default: ${(s as { dfltText?: string }).dfltText ?? JSON.stringify(s.dflt)})`);
  }
  for (const word of ["--role", "--config", "cluster", "generate"]) expect(r.out).toContain(word);
});

test("binary runs the cluster", async () => {
  // `cluster` re-spawns the running program for each role; inside a compiled binary that is
  // the binary itself (Bun.main is a /$bunfs path there, not a script on disk).
  const c = spawnProc([bin, "cluster", "--decode", "1"], { cwd: dir.path });
  try {
    await c.waitLine((l) => l.startsWith("serving;"), 40_000);
    const rows = c.lines.filter((l) => /^\s+(gateway|prefill|decode)\s/.test(l));
    expect(rows.length).toBe(3);
    const pids = rows.map((l) => Number(/ pid (\d+)/.exec(l)![1]));
    const gateway = /http (127\.0\.0\.1:\d+)/.exec(rows[0]!)![1]!;
    expect(await (await fetch(`http://${gateway}/health`)).json()).toMatchObject({ workers: { prefill: 1, decode: 1 } });
    // The embedded default model, materialized from the binary (cwd is a temp dir, not the repo).
    expect(c.lines[0]).toContain(`(model ${DEFAULT_MODEL_NAME})`);
    expect(c.lines.some((l) => l.startsWith("  disaggregated: prefill on prefill-0, decode on decode-0"))).toBe(true);
    expect(c.lines).toContain("  same text: yes");
    const g = expected.greedy[0]!;
    const res = await fetch(`http://${gateway}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: g.prompt, max_tokens: g.completion_ids.length, temperature: 0, return_token_ids: true }),
    });
    expect(((await res.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids).toEqual(g.completion_ids);
    for (const pid of pids) expect(alive(pid)).toBe(true);
    c.proc.kill("SIGINT");
    expect(await exitWithin(c.proc, 20_000)).toBe(0);
    expect(await waitGone(pids)).toEqual([]);
  } finally {
    killTree(c.proc.pid);
  }
}, 60_000);
