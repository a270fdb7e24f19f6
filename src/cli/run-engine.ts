import { hostname } from "node:os";
import { crc32cBackend } from "../codec/index.ts";
import { startGateway, type Gateway, type GatewayOptions } from "../gateway/index.ts";
import { log, shutdownTracing, startTracing, tracingEndpoint } from "../obs/index.ts";
import { chatRendererFor } from "../tokenizer/index.ts";
import { loadTokenizerFor } from "../model/index.ts";
import { startEngineNode, type EngineNode, type EngineNodeOptions } from "./engine-node.ts";
import { engineObservers } from "./engine-observers.ts";
import { ConfigError, GATEWAY_CONFIG_DEFAULTS, parseAddr, type Config, type EngineConfig, type GatewayConfig } from "./options.ts";
import { httpListener, securityFrom, type Security } from "./security.ts";
import { parentFromEnv, stopRequests } from "./stop-requests.ts";

/** Starts one engine from its config; prints one ready line with every address. */
export async function runEngine(config: Config): Promise<EngineNode> {
  const e = config.engine;
  const role = config.role as "prefill" | "decode" | "both";
  const listen = listenAddresses(e, role);
  const security = securityFrom(e, role, [listen.http.host], e.worker_id || undefined);
  traceTo(`tl-engine-${role}`, role, e.otlp_endpoint);
  const observers = engineObservers(role);
  const node = await startEngineNode({ ...engineNodeOptions(e, role, listen, security), ...observers.options });
  observers.observe(node);
  const kernels = node.model.kernels;
  if (kernels !== undefined && kernels !== "wasm-simd") log.warn("matmuls on the plain-JS fallback: one core, a fraction of the speed", { kernels });
  console.log(JSON.stringify(engineReadyLine(node, e, security)));
  return node;
}

type Listen = Record<"http" | "grpc" | "kv", { host: string; port: number }> & { kvData: { host: string; port: number } | null };

/** The listen options; every server binds http_listen's host (said when another one is given). */
function listenAddresses(e: EngineConfig, role: "prefill" | "decode" | "both"): Listen {
  const http = parseAddr(e.http_listen);
  const grpc = parseAddr(e.grpc_listen);
  const kv = parseAddr(e.kv_listen);
  const kvData = e.kv_data_listen ? parseAddr(e.kv_data_listen) : null;
  const bound = role === "prefill" ? [grpc] : [grpc, kv, kvData ?? http];
  if (bound.some((a) => a.host !== http.host)) log.warn(`every server binds http_listen's host ${http.host}; the other listen hosts are ignored`);
  if (!e.advertise_host && e.gateway_registry && ["0.0.0.0", "::"].includes(http.host)) {
    log.warn(`binding ${http.host} without advertise_host: the gateway and peers are told ${http.host}, which only this host can reach`);
  }
  return { http, grpc, kv, kvData };
}

/** [engine] as startEngineNode's options, one field each, read top to bottom beside the option table (options.ts). */
function engineNodeOptions(e: EngineConfig, role: "prefill" | "decode" | "both", listen: Listen, security: Security): EngineNodeOptions {
  const workerId = e.worker_id || security.tls?.current.self.workerId || undefined || `${role}-${hostname()}-${process.pid}`;
  return {
    role,
    workerId,
    frontDoor: frontDoorOf(security),
    tls: security.tls,
    host: listen.http.host,
    advertiseHost: e.advertise_host || undefined,
    httpPort: listen.http.port,
    grpcPort: listen.grpc.port,
    kvPort: listen.kv.port,
    kvDataPort: listen.kvData?.port,
    modelPath: e.model || undefined,
    tokenizerPath: e.tokenizer || undefined,
    servedModelName: e.served_model_name || undefined,
    chatTemplatePath: e.chat_template || undefined,
    toolCallParser: e.tool_call_parser || null,
    dtype: e.dtype,
    threads: e.threads,
    hugePages: e.huge_pages,
    modelThread: e.model_thread,
    blockTokens: e.block_tokens,
    numBlocks: e.num_blocks,
    // 0: the model's context.
    maxModelLen: e.max_model_len || undefined,
    maxBatchTokens: e.max_batch_tokens,
    handleTtlS: e.handle_ttl_s,
    pushIdleTimeoutMs: e.push_idle_timeout_ms,
    gatewayRegistry: e.gateway_registry || undefined,
    kvEvents: e.kv_events !== false,
    heartbeatIntervalMs: e.heartbeat_interval_ms,
    heartbeatTimeoutMs: e.heartbeat_timeout_ms,
  };
}

/** The one line an engine prints once it serves: every address and what it runs with. */
function engineReadyLine(node: EngineNode, e: EngineConfig, security: Security): Record<string, unknown> {
  return {
    msg: "ready",
    role: node.role,
    worker_id: node.workerId,
    pid: process.pid,
    model: node.model.name,
    ...modelFields(node),
    http: node.httpAddress,
    grpc: node.grpcAddress,
    kv: node.kvAddress || null,
    advertise_host: e.advertise_host || null,
    gateway_registry: e.gateway_registry || null,
    tls: security.mode,
    api_key: security.apiKeys.length > 0,
    crc32c: crc32cBackend(),
  };
}

export async function runGateway(config: Config): Promise<Gateway> {
  const g = config.gateway;
  const http = parseAddr(g.http_listen);
  const reg = parseAddr(g.registry_listen);
  const security = securityFrom(g, "gateway", [http.host]);
  const model = await loadTokenizerFor({
    modelPath: g.model || undefined,
    tokenizerPath: g.tokenizer || undefined,
    servedModelName: g.served_model_name || undefined,
  });
  traceTo("tl-engine-gateway", "gateway", g.otlp_endpoint);
  const maxModelLen = gatewayMaxModelLen(g.max_model_len, model.maxSeqLen, model.name);
  const never = neverDisaggregates(g.disagg_min_uncached_tokens, maxModelLen);
  if (never) log.warn(never);
  const gw = await startGateway({
    host: http.host,
    httpPort: http.port,
    registryPort: reg.port,
    tokenizer: model.tokenizer,
    chat: chatRendererFor(model.tokenizer, model.chatTemplate ?? null, g.chat_template || undefined),
    toolParser: g.tool_call_parser || null,
    modelName: model.name,
    maxModelLen,
    ...gatewayTuning(g),
    frontDoor: frontDoorOf(security),
    tls: security.tls,
    routingHeaders: g.routing_headers === true,
    ...(security.apiKeys[0] !== undefined ? { engineApiKey: security.apiKeys[0] } : {}),
  });
  console.log(
    JSON.stringify({
      msg: "ready",
      role: "gateway",
      pid: process.pid,
      model: model.name,
      http: gw.httpAddress,
      registry: gw.registryAddress,
      gateway_id: gw.gatewayId,
      tls: security.mode,
      api_key: security.apiKeys.length > 0,
    }),
  );
  return gw;
}

/** startGateway's tuning from [gateway] options (GATEWAY_CONFIG_DEFAULTS: every default, from SPECS). */
export function gatewayTuning(g: GatewayConfig = GATEWAY_CONFIG_DEFAULTS) {
  return {
    heartbeatIntervalMs: g.heartbeat_interval_ms,
    maxWorkers: g.max_workers,
    prefixIndexMaxBlocks: g.prefix_index_max_blocks,
    routeWeights: { overlap: g.route_overlap_weight, load: g.route_load_weight },
    prefillTimeoutMs: g.prefill_timeout_ms,
    firstByteTimeoutMs: g.first_byte_timeout_ms,
    interTokenTimeoutMs: g.inter_token_timeout_ms,
    stallSuspectMs: g.stall_suspect_ms,
    suspectCooldownMs: g.suspect_cooldown_ms,
    disaggMinUncachedTokens: g.disagg_min_uncached_tokens,
    frontDoor: httpListener(g),
  } satisfies Partial<GatewayOptions>;
}

/**
 * A threshold no prompt can reach (it must leave room for one output token) sends every request
 * to decode-local prefill: prefill engines would never work. Said at start, in words.
 */
export function neverDisaggregates(minUncached: number, maxModelLen: number): string | null {
  if (minUncached < maxModelLen) return null;
  return `disagg_min_uncached_tokens ${minUncached} ≥ max_model_len ${maxModelLen}: every prompt is shorter, so every request is prefilled on its decode engine and prefill engines sit idle (0 disaggregates every request)`;
}

/** max_model_len, at most the model's context; 0: the context, which a vocabulary-only GGUF may not give. */
function gatewayMaxModelLen(option: number, context: number, name: string): number {
  const len = Math.min(option || Infinity, context);
  if (!Number.isFinite(len)) throw new ConfigError(`model ${name} states no context length: give [gateway] max_model_len (--max-model-len)`);
  return len;
}

function frontDoorOf(s: Security) {
  return { apiKeys: s.apiKeys, metricsNeedKey: s.metricsNeedKey, maxRequestBytes: s.maxRequestBytes, ...s.http };
}

function modelFields(node: EngineNode): Record<string, unknown> {
  const s = node.model.stats;
  const held = {
    weights_dtype: node.model.dtype ?? null,
    threads: node.model.threads ?? null,
    kernels: node.model.kernels ?? null,
    kernel_memories: node.model.memories ?? null,
    // Where the KV pool is: in the kernel memories, read in place; or a slab of its own, whose
    // layers attention copies into the kernels' memory first (slower at long contexts).
    kv_pool: node.kvInKernel ? "in_kernel" : "own_slab",
    huge_pages: node.model.hugePages ?? null,
    model_thread: node.model.sharedSlab ? "worker" : "main",
  };
  return s ? { parameters: s.parameters, dtype: s.dtype, resident_bytes: s.residentBytes, ...held } : held;
}

/** OTLP export when the option or OTEL_EXPORTER_OTLP_ENDPOINT names a collector; off (no provider) otherwise. */
function traceTo(serviceName: string, role: string, option: string): void {
  const endpoint = tracingEndpoint(option || undefined);
  if (endpoint === undefined) return;
  startTracing({ serviceName, endpoint, attributes: { "tl.role": role } });
  log.info("tracing", { endpoint, service: serviceName });
}

/**
 * SIGTERM, SIGINT, SIGHUP, or the `engine cluster` that started this process going away
 * (however it died): stop admitting, finish in-flight work within the deadline, stop, exit 0.
 */
export function exitOnSignal(stop: () => Promise<unknown>): void {
  void stopRequests(parentFromEnv()).then((why) => {
    log.info("stopping", { signal: why });
    // Spans still batched are flushed before exit (bounded: a dead collector must not block it).
    stop()
      .then(() => shutdownTracing())
      .then(
        () => process.exit(0),
        (e) => {
          log.error("stop failed", { error: String(e) });
          process.exit(1);
        },
      );
  });
}
