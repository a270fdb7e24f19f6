import { createServer } from "node:net";
import { sseData } from "../http/index.ts";
import { log } from "../obs/index.ts";
import { ConfigError, type Config } from "./options.ts";
import { type RoleProcess, spawnRole } from "./spawn-role.ts";

async function freePort(preferred = 0): Promise<number> {
  const tryPort = (p: number) =>
    new Promise<number>((resolve, reject) => {
      const s = createServer();
      s.once("error", reject);
      s.listen(p, "127.0.0.1", () => {
        const port = (s.address() as { port: number }).port;
        s.close(() => resolve(port));
      });
    });
  if (preferred > 0) {
    try {
      return await tryPort(preferred);
    } catch {}
  }
  return tryPort(0);
}

/** How to start this same program again: the compiled binary, or bun with this script. */
function selfCommand(): string[] {
  const main = Bun.main;
  return main.startsWith("/$bunfs") || main.includes("~BUN") ? [process.execPath] : [process.execPath, main];
}

type Child = RoleProcess;

/** A role of this same program as its own process. */
function startRole(name: string, args: string[]): Child {
  return spawnRole(name, [...selfCommand(), ...args]);
}

/**
 * `engine cluster`: a gateway, N prefill and M decode engines, each its own process on
 * loopback, as in production; one demo request; then serve until Ctrl-C.
 */
export async function runCluster(config: Config, rest: Map<string, string>, opts: { demo?: boolean; wait?: boolean } = {}) {
  const count = (k: string, d: number) => {
    const v = rest.get(k);
    if (v === undefined) return d;
    if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 16) throw new ConfigError(`--${k}: want 1..16, got ${JSON.stringify(v)}`);
    return Number(v);
  };
  const nP = count("prefill", 1);
  const nD = count("decode", 2);
  for (const k of rest.keys()) if (!["prefill", "decode"].includes(k)) throw new ConfigError(`unknown option --${k}`);
  const e = config.engine;
  const model = String(e.model);
  const tokenizer = String(e.tokenizer);
  const modelArgs = model ? ["--model", model, ...(tokenizer ? ["--tokenizer", tokenizer] : [])] : [];
  // The gateway and every engine must agree on the name requests give.
  if (e.served_model_name) modelArgs.push("--served-model-name", String(e.served_model_name));
  // Every role exports to the same collector (OTEL_EXPORTER_OTLP_ENDPOINT reaches them through the environment).
  if (e.chat_template) modelArgs.push("--chat-template", String(e.chat_template));
  if (e.otlp_endpoint) modelArgs.push("--otlp-endpoint", String(e.otlp_endpoint));
  const beat = String(Math.min(Number(e.heartbeat_interval_ms), 1000));

  const httpPort = await freePort(8000);
  const regPort = await freePort();
  const children: Child[] = [];
  const stopAll = async () => {
    for (const c of children) c.proc.kill("SIGTERM");
    await Promise.all(children.map((c) => Promise.race([c.proc.exited, Bun.sleep(15_000).then(() => c.proc.kill("SIGKILL"))])));
  };
  try {
    const gw = startRole("gateway", [
      "--role",
      "gateway",
      "--http-listen",
      `127.0.0.1:${httpPort}`,
      "--registry-listen",
      `127.0.0.1:${regPort}`,
      "--heartbeat-interval-ms",
      beat,
      ...modelArgs,
    ]);
    children.push(gw);
    await gw.ready;
    const engineArgs = async (role: string, i: number) => [
      "--role",
      role,
      "--worker-id",
      `${role}-${i}`,
      "--http-listen",
      `127.0.0.1:${await freePort()}`,
      "--grpc-listen",
      `127.0.0.1:${await freePort()}`,
      "--kv-listen",
      `127.0.0.1:${await freePort()}`,
      "--gateway-registry",
      `127.0.0.1:${regPort}`,
      "--heartbeat-interval-ms",
      beat,
      "--block-tokens",
      String(e.block_tokens),
      "--num-blocks",
      String(e.num_blocks),
      "--max-model-len",
      String(e.max_model_len),
      ...modelArgs,
    ];
    for (let i = 0; i < nP; i++) children.push(startRole(`prefill-${i}`, await engineArgs("prefill", i)));
    for (let i = 0; i < nD; i++) children.push(startRole(`decode-${i}`, await engineArgs("decode", i)));
    const ready = await Promise.all(children.map((c) => c.ready));
    const base = `http://127.0.0.1:${httpPort}`;
    // Ready lines say the servers are up; the registry listing them says routing can begin.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const h = (await (await fetch(`${base}/health`)).json()) as { workers: { prefill: number; decode: number } };
      if (h.workers.prefill === nP && h.workers.decode === nD) break;
      if (Date.now() > deadline) throw new Error(`registry lists ${JSON.stringify(h.workers)}, want ${nP} prefill and ${nD} decode`);
      await Bun.sleep(50);
    }
    const print = (s: string) => process.stdout.write(s + "\n");
    print(`tl-engine cluster is up (model ${String(ready[0]!.model)}${model ? "" : "; its text is meaningless unless you pass --model"})`);
    for (const r of ready)
      print(
        `  ${String(r.role).padEnd(8)} ${String(r.worker_id ?? "gateway").padEnd(10)} pid ${String(r.pid).padEnd(8)} http ${String(r.http)}${r.grpc ? `  grpc ${String(r.grpc)}` : ""}${r.kv ? `  kv ${String(r.kv)}` : ""}${r.registry ? `  registry ${String(r.registry)}` : ""}`,
      );
    print("");
    print("try:");
    print(`  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' \\`);
    print(`    -d '{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32,"stream":true}'`);
    print(`  curl ${base}/metrics`);
    if (opts.demo ?? true) await demo(base, print);
    if (opts.wait ?? true) {
      print("\nserving; Ctrl-C stops every process");
      await new Promise<void>((resolve) => {
        process.once("SIGINT", () => resolve());
        process.once("SIGTERM", () => resolve());
      });
      print("stopping...");
      await stopAll();
    }
    return { base, httpPort, regPort, stop: stopAll, children };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

async function demo(base: string, print: (s: string) => void) {
  print("\ndemo: one streamed chat completion through the gateway");
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 48, stream: true, seed: 7, temperature: 0.8 }),
  });
  if (res.status !== 200) {
    print(`  demo failed: ${res.status} ${await res.text()}`);
    return;
  }
  let text = "";
  for await (const data of sseData(res.body!)) {
    if (data === "[DONE]") break;
    const obj = JSON.parse(data) as { choices?: { delta?: { content?: string } }[] };
    text += obj.choices?.[0]?.delta?.content ?? "";
  }
  const h = res.headers;
  print(`  > ${JSON.stringify(text)}`);
  print(
    `  served ${h.get("x-tl-served")}: prefill on ${h.get("x-tl-prefill-worker")}, decode on ${h.get("x-tl-decode-worker")}; ` +
      `KV blocks sent ${h.get("x-tl-blocks-sent")}, deduped ${h.get("x-tl-blocks-deduped")}, ${h.get("x-tl-payload-bytes")} bytes`,
  );
  log.debug("demo done");
}
