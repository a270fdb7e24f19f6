import { afterAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { existsSync, statSync } from "node:fs";
import { WorkerRegistry } from "../../src/gen/tl/control/v1/control_pb.ts";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { KvTransfer } from "../../src/gen/tl/kv/v1/kv_pb.ts";
import { DEFAULT_MODEL_NAME } from "../../src/model/load/default-model.ts";
import { CLUSTER_TLS_NAME } from "../../src/rpc/tls-config.ts";
import { testPki } from "../support/certs.ts";
import { exitWithin, killAll, killTree, spawnProc } from "../cli/procs.ts";

afterAll(killAll);

const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => "ok",
    (e: unknown) => (e instanceof ConnectError ? Code[e.code] : String(e)),
  );

test("cluster runs mtls by default", async () => {
  // As a user starts it, plus an API key for the front door.
  const cluster = spawnProc([process.execPath, "bin/engine.ts", "cluster", "--decode", "1", "--api-key", "sk-test"]);
  try {
    await cluster.waitLine((l) => l.startsWith("serving;"), 45_000);
    const mode = cluster.lines.find((l) => l.startsWith("internal ports:"))!;
    const pkiDir = /certificates in (\S+) \(removed on exit\)/.exec(mode)![1]!;
    expect(statSync(pkiDir).mode & 0o777).toBe(0o700);
    expect(statSync(`${pkiDir}/decode-0.key`).mode & 0o777).toBe(0o600);
    const rows = cluster.lines.filter((l) => /^\s+(gateway|prefill|decode)\s/.test(l));
    const addr = (role: string, what: string) => new RegExp(`${what} (127\\.0\\.0\\.1:\\d+)`).exec(rows.find((l) => l.trim().startsWith(role))!)![1]!;
    const gateway = addr("gateway", "http");

    // The openai client works through the gateway (with the key), and not without it.
    const openai = (apiKey: string) => new OpenAI({ baseURL: `http://${gateway}/v1`, apiKey, maxRetries: 0, timeout: 30_000 });
    const done = await openai("sk-test").completions.create({ model: DEFAULT_MODEL_NAME, prompt: "Once upon a time", max_tokens: 8 });
    expect(done.choices[0]!.text.length).toBeGreaterThan(0);
    const refused = await openai("wrong")
      .completions.create({ model: "m", prompt: "x", max_tokens: 1 })
      .then(
        () => null,
        (e: unknown) => e as { status?: number },
      );
    expect(refused?.status).toBe(401);

    // Every internal port refuses a plaintext client, and a certificate of another CA.
    const pki = await testPki();
    const stranger = pki.stranger("gateway");
    const ports: [string, (t: ReturnType<typeof createGrpcTransport>) => Promise<unknown>][] = [
      [addr("gateway", "registry"), (t) => createClient(WorkerRegistry, t).listWorkers({})],
      [addr("prefill", "grpc"), (t) => createClient(EngineControl, t).drain({ deadlineMs: 0n })],
      [addr("decode", "grpc"), (t) => createClient(EngineControl, t).drain({ deadlineMs: 0n })],
      [addr("decode", "kv"), (t) => createClient(KvTransfer, t).hasBlocks({ hashes: [1n], kvFormat: 1 })],
    ];
    for (const [target, call] of ports) {
      expect({ target, plaintext: await codeOf(call(createGrpcTransport({ baseUrl: `http://${target}`, defaultTimeoutMs: 3000 }))) }).not.toEqual({
        target,
        plaintext: "ok",
      });
      const session = new Http2SessionManager(`https://${target}`, undefined, {
        ca: stranger.ca,
        cert: stranger.cert,
        key: stranger.key,
        servername: CLUSTER_TLS_NAME,
        rejectUnauthorized: false,
      });
      expect({
        target,
        stranger: await codeOf(call(createGrpcTransport({ baseUrl: `https://${target}`, sessionManager: session, defaultTimeoutMs: 3000 }))),
      }).not.toEqual({ target, stranger: "ok" });
      session.abort();
    }
    const health = (await (await fetch(`http://${gateway}/health`)).json()) as { workers: { prefill: number; decode: number } };
    expect(health.workers).toMatchObject({ prefill: 1, decode: 1 });

    cluster.proc.kill("SIGINT");
    expect(await exitWithin(cluster.proc, 20_000)).toBe(0);
    // The ephemeral keys do not outlive the cluster.
    expect(existsSync(pkiDir)).toBe(false);
  } finally {
    killTree(cluster.proc.pid);
  }
}, 60_000);

test("cluster plaintext on request", async () => {
  const { parseArgs } = await import("../../src/cli/options.ts");
  const { rest } = parseArgs(["--plaintext", "--decode", "1"]);
  expect(rest.get("plaintext")).toBe("true");
  expect(rest.get("decode")).toBe("1");
});
