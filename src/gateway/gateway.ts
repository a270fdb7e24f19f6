import { WorkerRegistry as WorkerRegistryService } from "../gen/tl/control/v1/control_pb.ts";
import { releaseUnclaimed } from "../handoff/index.ts";
import { type HttpServer, serveHttp } from "../http/index.ts";
import { type ChatRenderer, type Tokenizer, tokenizerFingerprint } from "../model/index.ts";
import { createMetrics, log, type Metrics } from "../obs/index.ts";
import { type GrpcServer, serveGrpc } from "../rpc/index.ts";
import { RoutingTransport } from "../transfer/index.ts";
import { Admission } from "./admission.ts";
import { Completions } from "./completions.ts";
import { InFlight, PairPicker } from "./pair-picker.ts";
import { PrefillClient } from "./prefill-client.ts";
import { RegistryService } from "./registry-service.ts";
import { KvAffinity } from "./router.ts";
import { gatewayRoutes } from "./routes.ts";
import { WorkerRegistry } from "./worker-registry.ts";

export interface GatewayOptions {
  host?: string;
  httpPort?: number;
  registryPort?: number;
  tokenizer: Tokenizer;
  /** The model's chat template, as the engines render it (prompt hashes must match theirs). */
  chat?: ChatRenderer;
  modelName: string;
  maxModelLen: number;
  /** Beat interval told to engines; a worker is evicted after 3 silent intervals. */
  heartbeatIntervalMs?: number;
  prefillTimeoutMs?: number;
}

export interface Gateway {
  readonly httpAddress: string;
  readonly registryAddress: string;
  readonly registry: WorkerRegistry;
  readonly metrics: Metrics;
  /** Refuses new requests (503) and waits for in-flight ones up to the deadline; resolves with those left. */
  drain(deadlineMs: number): Promise<number>;
  stop(): Promise<void>;
}

/** The front door: registry for heartbeats, OpenAI HTTP for clients, routing in between. */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const host = opts.host ?? "127.0.0.1";
  const registry = new WorkerRegistry({ intervalMs: opts.heartbeatIntervalMs ?? 2000 });
  const registryService = new RegistryService(registry, {
    expect: { model: opts.modelName, vocabSize: opts.tokenizer.vocabSize, tokenizerFingerprint: tokenizerFingerprint(opts.tokenizer) },
  });
  const metrics = createMetrics();
  const affinity = new KvAffinity();
  const inflight = new InFlight();
  const admission = new Admission();
  // Release only: pushes are the prefill engines' business.
  const releaser = new RoutingTransport({ dataPlane: false, timeoutMs: 5000 });
  const grpc: GrpcServer = await serveGrpc((r) => r.service(WorkerRegistryService, registryService.impl), { host, port: opts.registryPort ?? 0 });
  const completions = new Completions({
    tokenizer: opts.tokenizer,
    chat: opts.chat,
    modelName: opts.modelName,
    maxModelLen: opts.maxModelLen,
    picker: new PairPicker(registry, affinity, inflight),
    prefill: new PrefillClient(opts.prefillTimeoutMs ?? 60_000),
    affinity,
    inflight,
    metrics,
    admission,
    release: (kvAddress, handleId, requestId) =>
      releaseUnclaimed(releaser, kvAddress, handleId, (e) => log.warn("release failed", { request_id: requestId, handle: handleId, error: String(e) })),
  });
  const routes = gatewayRoutes({ modelName: opts.modelName, maxModelLen: opts.maxModelLen, registry, metrics, admission, completions });
  const http: HttpServer = serveHttp(routes, { host, port: opts.httpPort ?? 0 });
  return {
    httpAddress: http.address,
    registryAddress: grpc.address,
    registry,
    metrics,
    drain: (deadlineMs) => admission.drain(deadlineMs),
    async stop() {
      registryService.close();
      await http.stop();
      await grpc.close();
      await releaser.close();
    },
  };
}
