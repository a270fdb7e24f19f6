// What the connection guard (src/http/conn-guard.ts) costs every HTTP request: serveHttp (the
// guard on TCP spliced to Bun.serve on a Unix socket) against Bun.serve alone on TCP, the same
// handler, in alternating rounds. Two loads: small JSON requests on kept-alive connections (one
// hop more per request) and SSE streams of 200 events (a stream of tokens). Writes
// bench/results/http-guard.json.
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { serveHttp } from "../src/http/index.ts";
import { loadAverage, median } from "./stats.ts";
import { GATEWAY_CONFIG_DEFAULTS } from "../src/cli/options.ts";
import { httpListener } from "../src/cli/security.ts";

const ROUNDS = 7;
const REQUESTS = 400;
const CONCURRENCY = 8;
const STREAMS = 20;
const EVENTS = 200;

const enc = new TextEncoder();
async function handler(req: Request): Promise<Response> {
  if (new URL(req.url).pathname === "/stream") {
    let i = 0;
    return new Response(
      new ReadableStream({
        async pull(c) {
          if (i++ >= EVENTS) return c.close();
          c.enqueue(enc.encode(`data: {"choices":[{"index":0,"text":"tok${i}"}]}\n\n`));
          if (i % 20 === 0) await Bun.sleep(0);
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  }
  const body = req.body ? await req.text() : "";
  return Response.json({ ok: true, bytes: body.length });
}

const guarded = await serveHttp(handler, httpListener(GATEWAY_CONFIG_DEFAULTS));
const bare = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: handler });
const targets = { guarded: `http://${guarded.address}`, bare: `http://127.0.0.1:${bare.port}` };

async function requests(base: string): Promise<number> {
  const t0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < REQUESTS) await (await fetch(`${base}/v1/completions`, { method: "POST", body: '{"prompt":"x","max_tokens":1}' })).arrayBuffer();
    }),
  );
  return (performance.now() - t0) / REQUESTS;
}

async function streams(base: string): Promise<number> {
  const t0 = performance.now();
  await Promise.all(Array.from({ length: STREAMS }, async () => await (await fetch(`${base}/stream`)).arrayBuffer()));
  return performance.now() - t0;
}

const runs: Record<string, Record<"guarded" | "bare", number[]>> = { request_ms: { guarded: [], bare: [] }, streams_ms: { guarded: [], bare: [] } };
await requests(targets.bare);
await requests(targets.guarded);
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? (["guarded", "bare"] as const) : (["bare", "guarded"] as const);
  for (const who of order) {
    runs.request_ms![who].push(await requests(targets[who]));
    runs.streams_ms![who].push(await streams(targets[who]));
  }
}
await guarded.stop();
bare.stop(true);

const results: Record<string, { guarded: number; bare: number; ratio: number }> = {};
for (const [name, v] of Object.entries(runs)) {
  const g = median(v.guarded);
  const b = median(v.bare);
  results[name] = { guarded: g, bare: b, ratio: g / b };
  console.log(`${name}: guarded ${g.toFixed(3)}, bare ${b.toFixed(3)}, ratio ${(g / b).toFixed(2)}x (median of ${ROUNDS} alternating rounds)`);
}
const load = loadAverage();
const cpu = cpus()[0]?.model ?? "unknown";
console.log(`load average ${load}; ${cpu}`);
mkdirSync(new URL("./results/", import.meta.url), { recursive: true });
writeFileSync(
  new URL("./results/http-guard.json", import.meta.url),
  `${JSON.stringify({ rounds: ROUNDS, requests: REQUESTS, concurrency: CONCURRENCY, streams: STREAMS, events: EVENTS, load, cpu, results }, null, 2)}\n`,
);
