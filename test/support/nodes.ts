import { sseData } from "../../src/http/index.ts";
import { ByteTokenizer } from "../../src/tokenizer/index.ts";
import type { ServedModel } from "../../src/cli/engine-node.ts";
import { FakeRunner } from "./fake-model.ts";

/** The fake model behind a byte tokenizer: fast, and any misplaced KV changes its tokens. */
export function fakeServedModel(): ServedModel {
  const tokenizer = new ByteTokenizer();
  return {
    name: "fake",
    runner: new FakeRunner(tokenizer.vocabSize),
    tokenizer,
    nLayers: 2,
    nKvHeads: 2,
    headDim: 4,
    maxSeqLen: 512,
  };
}

/** Reads an SSE body into its JSON events (the [DONE] marker becomes the string "[DONE]"). */
export async function sseEvents(res: Response): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const d of sseData(res.body!)) out.push(d === "[DONE]" ? d : JSON.parse(d));
  return out;
}

import { startEngineNode, type EngineNode, type EngineNodeOptions } from "../../src/cli/engine-node.ts";
import { startGateway, type Gateway, type GatewayOptions } from "../../src/gateway/index.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";
import { TlsSource } from "../../src/rpc/tls-config.ts";
import { leafFiles, type TestPki } from "./certs.ts";
import { gatewayTuning } from "../../src/cli/run-engine.ts";

/**
 * startGateway's tuning in tests: the [gateway] defaults, except that every request is
 * disaggregated (disagg_min_uncached_tokens 0), which is what these tests look at.
 */
export const GATEWAY_TUNING = { ...gatewayTuning(), disaggMinUncachedTokens: 0 };

export interface TestCluster {
  gateway: Gateway;
  prefill: EngineNode[];
  decode: EngineNode[];
  both: EngineNode[];
  all(): EngineNode[];
  /** Resolves once the registry lists `n` live workers. */
  waitForWorkers(n: number, timeoutMs?: number): Promise<void>;
  stop(): Promise<void>;
}

/** A gateway for the fake model with no engine yet (tests start theirs), told to expect beats every 100 ms. */
export function startLoneGateway(more: Partial<GatewayOptions> = {}): Promise<Gateway> {
  return startGateway({ ...GATEWAY_TUNING, tokenizer: fakeServedModel().tokenizer, modelName: "fake", maxModelLen: 512, heartbeatIntervalMs: 100, ...more });
}

/** A gateway and engines in this process with the fake model, beating every `intervalMs`. */
export async function startTestCluster(opts: {
  prefill?: number;
  decode?: number;
  both?: number;
  intervalMs?: number;
  node?: Partial<EngineNodeOptions>;
  gateway?: Partial<GatewayOptions>;
  /** Mutual TLS everywhere, each process with its own leaf of this PKI (`<role>-<i>`). */
  pki?: TestPki;
}): Promise<TestCluster> {
  const intervalMs = opts.intervalMs ?? 100;
  const tokenizer = fakeServedModel().tokenizer;
  const pki = opts.pki;
  const tlsFor = async (role: PeerRole, id: string) => (pki ? new TlsSource(await leafFiles(pki, role, id)) : null);
  const gateway = await startGateway({
    ...GATEWAY_TUNING,
    tokenizer,
    modelName: "fake",
    maxModelLen: 512,
    heartbeatIntervalMs: intervalMs,
    tls: await tlsFor("gateway", "gateway-0"),
    routingHeaders: true,
    ...opts.gateway,
  });
  const start = async (role: "prefill" | "decode" | "both", i: number) =>
    startEngineNode({
      tls: await tlsFor(role, `${role}-${i}`),
      role,
      workerId: `${role}-${i}`,
      model: fakeServedModel(),
      blockTokens: 4,
      numBlocks: 256,
      gatewayRegistry: gateway.registryAddress,
      heartbeatIntervalMs: intervalMs,
      heartbeatTimeoutMs: 500,
      ...opts.node,
    });
  const range = (n = 0) => Array.from({ length: n }, (_, i) => i);
  const [prefill, decode, both] = await Promise.all([
    Promise.all(range(opts.prefill).map((i) => start("prefill", i))),
    Promise.all(range(opts.decode).map((i) => start("decode", i))),
    Promise.all(range(opts.both).map((i) => start("both", i))),
  ]);
  const c: TestCluster = {
    gateway,
    prefill,
    decode,
    both,
    all: () => [...prefill, ...decode, ...both],
    async waitForWorkers(n, timeoutMs = 20_000) {
      const end = Date.now() + timeoutMs;
      while (gateway.registry.live().length !== n) {
        if (Date.now() > end) throw new Error(`registry lists ${gateway.registry.live().length} workers, want ${n}`);
        await Bun.sleep(10);
      }
    },
    async stop() {
      await Promise.all(c.all().map((n) => n.shutdown()));
      await gateway.stop();
    },
  };
  await c.waitForWorkers(prefill.length + decode.length + both.length);
  return c;
}
