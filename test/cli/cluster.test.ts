import { afterAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { roleArgs } from "../../src/cli/spawn-role.ts";
import { alive, exitWithin, killAll, killTree, spawnProc, waitGone } from "./procs.ts";

afterAll(killAll);

/** Streams one chat completion with the official client; returns the text and how it was served. */
async function chat(baseURL: string, seed: number): Promise<{ text: string; served: string | null; finish: string | null }> {
  const client = new OpenAI({ baseURL, apiKey: "not-checked", maxRetries: 0, timeout: 30_000 });
  const models = await client.models.list();
  const model = models.data[0]!.id;
  const { data: stream, response } = await client.chat.completions
    .create({
      model,
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: "Write a short poem about paged attention and KV caches, please." },
      ],
      stream: true,
      seed,
      temperature: 0.9,
      top_p: 0.95,
      max_tokens: 40,
    })
    .withResponse();
  let text = "";
  let finish: string | null = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { text, served: response.headers.get("x-tl-served"), finish };
}

test("cluster serves openai clients", async () => {
  // As a user would: `npm start` is `bun bin/engine.ts cluster`.
  const cluster = spawnProc([process.execPath, "bin/engine.ts", "cluster"]);
  const colocated = spawnProc([process.execPath, "bin/engine.ts", ...roleArgs("both")]);
  try {
    const t0 = performance.now();
    await cluster.waitLine((l) => l.startsWith("serving;"), 45_000);
    if (process.env.TL_TEST_TIMINGS) console.log(`cluster up and demo done in ${Math.round(performance.now() - t0)} ms`);
    const rows = cluster.lines.filter((l) => /^\s+(gateway|prefill|decode)\s/.test(l));
    expect(rows.map((l) => l.trim().split(/\s+/)[0])).toEqual(["gateway", "prefill", "decode", "decode"]);
    const pids = rows.map((l) => Number(/ pid (\d+)/.exec(l)![1]));
    const gateway = /http (127\.0\.0\.1:\d+)/.exec(rows[0]!)![1]!;
    const engine = String((await colocated.ready()).http);

    const seed = 1234;
    const viaCluster = await chat(`http://${gateway}/v1`, seed);
    const viaEngine = await chat(`http://${engine}/v1`, seed);
    expect(viaCluster.served).toBe("disaggregated");
    expect(viaCluster.finish).toBe("length");
    expect(viaCluster.text.length).toBeGreaterThan(0);
    expect(viaCluster.text).toBe(viaEngine.text);
    // The seed matters: another one samples another text.
    expect((await chat(`http://${gateway}/v1`, seed + 1)).text).not.toBe(viaCluster.text);

    for (const pid of pids) expect(alive(pid)).toBe(true);
    cluster.proc.kill("SIGINT");
    expect(await exitWithin(cluster.proc, 20_000)).toBe(0);
    expect(await waitGone([cluster.proc.pid, ...pids])).toEqual([]);
    expect(cluster.lines).toContain("stopping...");
  } finally {
    killTree(cluster.proc.pid);
    colocated.proc.kill("SIGKILL");
  }
}, 60_000);

test("cluster gateways 2: one front port round-robins over two replicas, and outlives kill -9 of one", async () => {
  const cluster = spawnProc([process.execPath, "bin/engine.ts", "cluster", "--gateways", "2", "--plaintext"]);
  await cluster.waitLine((l) => l.startsWith("serving;"), 60_000);
  const front = /front\s+(127\.0\.0\.1:\d+)/.exec(cluster.lines.find((l) => l.trim().startsWith("front"))!)![1]!;
  const rows = cluster.lines.filter((l) => /^\s+gateway\s/.test(l));
  expect(rows.length).toBe(2);
  // The demo says which replica served each of its two requests: both took part.
  const by = cluster.lines.map((l) => / by (gateway-[A-Za-z0-9.-]+?):/.exec(l)?.[1]).filter((x) => x !== undefined);
  expect(new Set(by).size).toBe(2);
  const ask = async () => {
    const res = await fetch(`http://${front}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", connection: "close" },
      body: JSON.stringify({ prompt: "In the beginning", max_tokens: 4 }),
      keepalive: false,
    });
    await res.text();
    return [res.status, res.headers.get("x-tl-gateway")] as const;
  };
  const before = await Promise.all([ask(), ask(), ask(), ask()]);
  expect(new Set(before.map((r) => r[1])).size).toBe(2);
  // kill -9 of one replica: the front skips it, every request succeeds on the other.
  killTree(Number(/ pid (\d+)/.exec(rows[0]!)![1]));
  // Its open connections end with it (streams on it are lost); the front closes their client side.
  await Bun.sleep(300);
  const after = [];
  for (let i = 0; i < 4; i++) after.push(await ask());
  expect(after.map((r) => r[0])).toEqual([200, 200, 200, 200]);
  expect(new Set(after.map((r) => r[1])).size).toBe(1);
  cluster.proc.kill("SIGTERM");
  await exitWithin(cluster.proc, 20_000);
}, 120_000);
