import { toBinary } from "@bufbuild/protobuf";
import { KvEventsSchema, WorkerRegistry as WorkerRegistryService } from "../gen/tl/control/v1/control_pb.ts";
import type { ToolParserName } from "../http/index.ts";
import { releaseUnclaimed } from "../handoff/index.ts";
import { type HttpListenerOptions, type HttpServer, serveHttp } from "../http/index.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import { type ChatRenderer, type Tokenizer, tokenizerFingerprint } from "../tokenizer/index.ts";
import { createMetrics, log, type Metrics } from "../obs/index.ts";
import { type GrpcServer, serveGrpc } from "../rpc/index.ts";
import { RoutingTransport } from "../transfer/index.ts";
import { Admission } from "./admission.ts";
import { PendingWork } from "./pending-work.ts";
import { Completions } from "./completions.ts";
import { InFlight, PairPicker } from "./pair-picker.ts";
import { PrefillClient } from "./prefill-client.ts";
import { MAX_HEARTBEAT_BYTES, RegistryService } from "./registry-service.ts";
import { PrefixIndex } from "./prefix-index.ts";
import { type CostWeights, Suspects } from "./router.ts";
import { gatewayRoutes } from "./routes.ts";
import { WorkerRegistry } from "./worker-registry.ts";

export interface GatewayOptions {
  host?: string;
  httpPort?: number;
  registryPort?: number;
  tokenizer: Tokenizer;
  /** The model's chat template, as the engines render it (prompt hashes must match theirs). */
  chat?: ChatRenderer;
  /** --tool-call-parser, as the engines': how tool_choice "auto" reads calls. */
  toolParser?: ToolParserName | null;
  modelName: string;
  maxModelLen: number;
  /**
   * The tuning below has no default here: every value comes from the caller, which takes it
   * from the [gateway] options (src/cli/options.ts SPECS, the one place defaults are written).
   * Beat interval told to engines; a worker is evicted after 3 silent intervals.
   */
  heartbeatIntervalMs: number;
  /** Deadline of one Prefill call (P's prefill and its push to D). */
  prefillTimeoutMs: number;
  /** Deadline for an engine stream's first byte (a resume: D's claim and first event). */
  firstByteTimeoutMs: number;
  /** Deadline between two events of an engine stream once it started. */
  interTokenTimeoutMs: number;
  /** A gap this long between two events makes the engine suspect without ending the stream. */
  stallSuspectMs: number;
  /** How long an engine that missed a deadline is scored out. */
  suspectCooldownMs: number;
  /** The decode-engine cost's weights (see CostWeights). */
  routeWeights: CostWeights;
  /** Prompts with fewer uncached tokens on the chosen D are prefilled there; 0: always disaggregate. */
  disaggMinUncachedTokens: number;
  /** API keys and the body bound of the front door. */
  frontDoor: HttpListenerOptions;
  /** Mutual TLS on the registry and toward every engine. */
  tls?: TlsSource | null;
  /** Most workers the registry holds. */
  maxWorkers: number;
  /** Bearer key the gateway presents to engines' HTTP ports (they take the cluster's API keys too). */
  engineApiKey?: string;
  /**
   * This replica's identity, told to engines in every heartbeat ack; handles it asks for are
   * bound to it, so engines free them early when it is gone. Default: `<gatewayName>.<8 hex>`,
   * fresh per process, so a restarted replica is a new one.
   */
  gatewayId?: string;
  /** The stem of the default gatewayId; default: the worker id of the gateway's certificate, else `gateway-<pid>`. */
  gatewayName?: string;
  /** Most blocks the prefix index holds from engines' KV events ([gateway] prefix_index_max_blocks). */
  prefixIndexMaxBlocks: number;
  /** Tell clients which workers served them (x-tl-prefill-worker / x-tl-decode-worker, the last chunk's tl.*_worker): a debugging aid, off by default. */
  routingHeaders?: boolean;
}

/** How long stop() waits for cut requests to give back what they hold (PendingWork). */
const STOP_SETTLE_MS = 2000;

export interface Gateway {
  readonly httpAddress: string;
  readonly registryAddress: string;
  readonly registry: WorkerRegistry;
  /** This replica's identity (HeartbeatAck.gateway_id, PrefillRequest.gateway_id). */
  readonly gatewayId: string;
  /** What the engines say they hold (their KV events), and this replica's routes until they say. */
  readonly prefixIndex: PrefixIndex;
  /** Engines routed around for now (they missed a deadline). */
  readonly suspects: Suspects;
  readonly metrics: Metrics;
  /** Refuses new requests (503) and waits for in-flight ones up to the deadline; resolves with those left. */
  drain(deadlineMs: number): Promise<number>;
  stop(): Promise<void>;
}

/** The front door: registry for heartbeats, OpenAI HTTP for clients, routing in between. */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const host = opts.host ?? "127.0.0.1";
  const registry = new WorkerRegistry({ intervalMs: opts.heartbeatIntervalMs });
  const tls = opts.tls ?? null;
  const gatewayId = opts.gatewayId ?? newGatewayId(opts.gatewayName || tls?.current.self.workerId || `gateway-${process.pid}`);
  const affinity = new PrefixIndex({ maxBlocks: opts.prefixIndexMaxBlocks });
  const metrics = createMetrics("gateway");
  const registryService = new RegistryService(registry, {
    maxWorkers: opts.maxWorkers,
    index: affinity,
    gatewayId,
    onKvEvents: (ev, answer) => {
      for (const e of ev.events) metrics.kvEvents.inc({ kind: ev.snapshot ? "snapshot" : e.removed ? "removed" : "stored" }, e.hashes.length);
      metrics.kvEventBytes.inc(toBinary(KvEventsSchema, ev).length);
      if (answer.snapshot) metrics.kvSnapshotsAsked.inc();
      metrics.prefixIndexBlocks.set(affinity.size);
    },
    expect: { model: opts.modelName, vocabSize: opts.tokenizer.vocabSize, tokenizerFingerprint: tokenizerFingerprint(opts.tokenizer) },
  });
  const inflight = new InFlight();
  const suspects = new Suspects(opts.suspectCooldownMs);
  const admission = new Admission();
  const pending = new PendingWork();
  // Release only: pushes are the prefill engines' business.
  // Every internal client dials over mTLS when the gateway holds a cluster set, and only
  // reaches a server whose certificate names the role it is meant to play.
  const releaser = new RoutingTransport({ dataPlane: false, timeoutMs: 5000, ...(tls ? { tls } : {}) });
  const grpc: GrpcServer = await serveGrpc((r) => r.service(WorkerRegistryService, registryService.impl), {
    host,
    port: opts.registryPort ?? 0,
    tls,
    maxMessageBytes: MAX_HEARTBEAT_BYTES,
  });
  const completions = new Completions({
    tokenizer: opts.tokenizer,
    chat: opts.chat,
    toolParser: opts.toolParser ?? null,
    modelName: opts.modelName,
    maxModelLen: opts.maxModelLen,
    picker: new PairPicker(registry, affinity, inflight, opts.routeWeights, suspects),
    prefill: new PrefillClient(opts.prefillTimeoutMs, tls, gatewayId),
    engineHeaders: opts.engineApiKey ? { authorization: `Bearer ${opts.engineApiKey}` } : {},
    routingHeaders: opts.routingHeaders === true,
    gatewayId,
    affinity,
    suspects,
    deadlines: {
      firstByteMs: opts.firstByteTimeoutMs,
      interTokenMs: opts.interTokenTimeoutMs,
      stallMs: opts.stallSuspectMs,
    },
    disaggMinUncachedTokens: opts.disaggMinUncachedTokens,
    metrics,
    admission,
    release: (kvAddress, handleId, requestId) =>
      pending.track(
        releaseUnclaimed(releaser, kvAddress, handleId, (e) => log.warn("release failed", { request_id: requestId, handle: handleId, error: String(e) })),
      ),
    pending,
  });
  const routes = gatewayRoutes({
    modelName: opts.modelName,
    maxModelLen: opts.maxModelLen,
    tokenizer: opts.tokenizer,
    ...(opts.chat ? { chat: opts.chat } : {}),
    registry,
    metrics,
    admission,
    completions,
    tls: tls === null ? "plaintext" : "mtls",
  });
  const http: HttpServer = await serveHttp(routes, { ...opts.frontDoor, host, port: opts.httpPort ?? 0 });
  return {
    httpAddress: http.address,
    registryAddress: grpc.address,
    registry,
    gatewayId,
    prefixIndex: affinity,
    suspects,
    metrics,
    drain: (deadlineMs) => admission.drain(deadlineMs),
    async stop() {
      registryService.close();
      await http.stop();
      // The requests that stop cut still owe their engines a release or two: let those go
      // out while the releaser is open, or the handles would wait out their time to live.
      await pending.settle(STOP_SETTLE_MS, () => admission.active > 0);
      await grpc.close();
      await releaser.close();
    },
  };
}

/**
 * A replica id unique per process: `<name>.<8 hex>`, a valid worker id (peer-identity.ts) that
 * a certificate for `name` speaks for (control-service.ts, checkGatewayId).
 */
function newGatewayId(name: string): string {
  const b = new Uint8Array(4);
  crypto.getRandomValues(b);
  return `${name}.${Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("")}`;
}
