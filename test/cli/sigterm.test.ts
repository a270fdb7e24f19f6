import { afterAll, expect, test } from "bun:test";
import { roleArgs } from "../../src/cli/spawn-role.ts";
import { alive, exitWithin, killAll, readSse, spawnProc } from "./procs.ts";

afterAll(killAll);

function startEngine(drainTimeoutS: number) {
  return spawnProc([
    process.execPath,
    "bin/engine.ts",
    ...roleArgs("both", [
      "--drain-timeout-s",
      String(drainTimeoutS),
      // The synthetic model: long streams that never stop early, at its pace.
      "--model",
      "tl-synthetic-4l",
    ]),
  ]);
}

/** Starts a streamed completion; resolves once `after` events arrived, with the promise of the rest (wrapped, so it is not awaited). */
async function streamUntil(http: string, maxTokens: number, after: number) {
  const res = await fetch(`http://${http}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "Once upon a time", max_tokens: maxTokens, stream: true, seed: 5, temperature: 0.7 }),
  });
  expect(res.status).toBe(200);
  let seen = 0;
  let reached!: () => void;
  const started = new Promise<void>((r) => (reached = r));
  const result = readSse(res, () => {
    if (++seen === after) reached();
  });
  await Promise.race([started, result]);
  return { result };
}

test("sigterm finishes streams within the drain deadline", async () => {
  const e = startEngine(20);
  try {
    const ready = await e.ready();
    const http = String(ready.http);
    const maxTokens = 300;
    const stream = await streamUntil(http, maxTokens, 3);
    const t0 = Date.now();
    e.proc.kill("SIGTERM");
    // While it drains it stays alive but admits nothing new.
    const health = async () => ((await (await fetch(`http://${http}/health`)).json()) as { status: string }).status;
    while ((await health()) !== "draining") {
      expect(Date.now() - t0).toBeLessThan(10_000);
      await Bun.sleep(10);
    }
    const refused = await fetch(`http://${http}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "late", max_tokens: 4 }),
    });
    expect(refused.status).toBe(503);
    const r = await stream.result;
    // All of it: finish_reason "length" comes only once max_tokens were generated.
    expect(r).toMatchObject({ finish: "length", done: true, error: null, broke: null });
    expect(await exitWithin(e.proc, 15_000)).toBe(0);
    // It left when the work was done, not at the deadline.
    expect(Date.now() - t0).toBeLessThan(20_000);
    expect(alive(e.proc.pid)).toBe(false);
  } finally {
    e.proc.kill("SIGKILL");
  }
}, 40_000);

test("sigterm past the drain deadline errors the stream", async () => {
  // The synthetic model decodes ~2,000 tok/s here (AMD EPYC, 2 cores): its longest stream takes
  // about a second, several times this deadline, and only a machine 4x faster would finish it.
  const drainS = 0.25;
  const e = startEngine(drainS);
  try {
    const http = String((await e.ready()).http);
    // Far more tokens than fit in the deadline: nearly the model's whole context.
    const maxTokens = 2000;
    const stream = await streamUntil(http, maxTokens, 3);
    const t0 = Date.now();
    e.proc.kill("SIGTERM");
    const r = await stream.result;
    const code = await exitWithin(e.proc, 15_000);
    const waited = Date.now() - t0;
    expect(code).toBe(0);
    expect(alive(e.proc.pid)).toBe(false);
    // Never a silent truncation: the stream ends with an error event, not [DONE], not a bare close.
    expect(r.done).toBe(false);
    expect(r.broke).toBeNull();
    expect(r.error).toContain("cancelled");
    expect(r.finish).toBeNull();
    expect(r.events).toBeLessThan(maxTokens);
    // The deadline was honoured: in-flight work kept running until it passed.
    expect(waited).toBeGreaterThanOrEqual(drainS * 1000 - 50);
  } finally {
    e.proc.kill("SIGKILL");
  }
}, 40_000);

test("sigterm_on_a_gateway_replica: readiness 503 at once, its streams finish, it exits; the engine keeps serving", async () => {
  const gw = spawnProc([
    process.execPath,
    "bin/engine.ts",
    ...roleArgs("gateway", ["--drain-timeout-s", "20", "--model", "tl-synthetic-4l", "--heartbeat-interval-ms", "200"]),
  ]);
  const gwReady = await gw.ready();
  const engine = (role: "prefill" | "decode") =>
    spawnProc([
      process.execPath,
      "bin/engine.ts",
      ...roleArgs(role, ["--model", "tl-synthetic-4l", "--gateway-registry", String(gwReady.registry), "--heartbeat-interval-ms", "200"]),
    ]);
  const engines = [engine("prefill"), engine("decode")];
  try {
    const engineHttp = String((await engines[1]!.ready()).http);
    await engines[0]!.ready();
    const http = String(gwReady.http);
    const health = async () => (await fetch(`http://${http}/health`)).status;
    // Ready: the registry lists a pair.
    const t0 = Date.now();
    for (;;) {
      const res = await fetch(`http://${http}/health`);
      const w = ((await res.json()) as { workers?: { prefill?: number; decode?: number } }).workers;
      if (res.status === 200 && (w?.prefill ?? 0) >= 1 && (w?.decode ?? 0) >= 1) break;
      expect(Date.now() - t0).toBeLessThan(20_000);
      await Bun.sleep(50);
    }
    const stream = await streamUntil(http, 300, 3);
    gw.proc.kill("SIGTERM");
    // Readiness turns at once, long before the stream ends: a Service stops sending it clients.
    const t1 = Date.now();
    while ((await health()) !== 503) {
      expect(Date.now() - t1).toBeLessThan(10_000);
      await Bun.sleep(5);
    }
    const r = await stream.result;
    expect(r).toMatchObject({ finish: "length", done: true, error: null, broke: null });
    expect(await exitWithin(gw.proc, 15_000)).toBe(0);
    // The engine the replica routed to is untouched: it serves the next replica's (here: a direct) request.
    const direct = await fetch(`http://${engineHttp}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "after", max_tokens: 4 }),
    });
    expect(direct.status).toBe(200);
  } finally {
    gw.proc.kill("SIGKILL");
    for (const e of engines) e.proc.kill("SIGKILL");
  }
}, 60_000);
