import { ConfigError, parseAddr, SPECS, type Config } from "./options.ts";

/** Which of the cluster's processes an option reaches. */
type Route = "all" | "engines" | "gateway";
type Rule = Route | { refuse: string };

const OWN_PORTS = "each engine of the cluster listens on a free loopback port it picks";
const CLUSTER_PKI = "the cluster mints one certificate per process from an ephemeral CA (--plaintext turns mutual TLS off)";

/**
 * How `engine cluster` treats every option: passed on to the processes it concerns, or
 * refused with the reason. An option this table does not name is refused too, so an
 * option added later is never silently ignored by the cluster.
 */
export const CLUSTER_OPTIONS: Readonly<Record<string, Rule>> = {
  worker_id: { refuse: "the cluster names its engines prefill-0, decode-0, ..." },
  // The cluster's http address is its front door: the gateway's.
  http_listen: "gateway",
  registry_listen: "gateway",
  grpc_listen: { refuse: OWN_PORTS },
  kv_listen: { refuse: OWN_PORTS },
  kv_data_listen: { refuse: OWN_PORTS },
  advertise_host: { refuse: "the cluster's processes reach each other on loopback" },
  gateway_registry: { refuse: "the cluster's engines beat to its own gateway (--registry-listen picks its address)" },
  model: "all",
  // The gateway and every engine must agree on the name requests give.
  served_model_name: "all",
  tokenizer: "all",
  // The gateway renders chat prompts (what it hashes and P prefills) with the engines' template.
  chat_template: "all",
  // The gateway reads tool calls from the text the engines generate.
  tool_call_parser: "all",
  max_model_len: "all",
  drain_timeout_s: "all",
  heartbeat_interval_ms: "all",
  otlp_endpoint: "all",
  block_tokens: "engines",
  num_blocks: "engines",
  max_batch_tokens: "engines",
  handle_ttl_s: "engines",
  kv_events: "engines",
  heartbeat_timeout_ms: "engines",
  push_idle_timeout_ms: "engines",
  dtype: "engines",
  threads: "engines",
  huge_pages: "engines",
  model_thread: "engines",
  // Every process's HTTP API asks for the key; the gateway presents it to the engines.
  api_key: "all",
  metrics_need_key: "all",
  max_request_bytes: "all",
  http_headers_timeout_s: "all",
  http_body_timeout_s: "all",
  http_max_connections: "all",
  http_health_reserve: "all",
  max_workers: "gateway",
  prefix_index_max_blocks: "gateway",
  routing_headers: "gateway",
  route_overlap_weight: "gateway",
  route_load_weight: "gateway",
  prefill_timeout_ms: "gateway",
  first_byte_timeout_ms: "gateway",
  inter_token_timeout_ms: "gateway",
  stall_suspect_ms: "gateway",
  suspect_cooldown_ms: "gateway",
  // The cluster disaggregates every request unless told otherwise (see runCluster).
  disagg_min_uncached_tokens: "gateway",
  // Only the front door can leave loopback (--http-listen); plaintext there needs the user's say-so.
  insecure: "gateway",
  tls_cert: { refuse: CLUSTER_PKI },
  tls_key: { refuse: CLUSTER_PKI },
  tls_ca: { refuse: CLUSTER_PKI },
};

/** Beats a local cluster uses unless told otherwise: fast enough that start-up waits little. */
const CLUSTER_BEAT_MS = 1000;

export interface ClusterFlags {
  /** Flags for the gateway, besides the listen addresses below. */
  gateway: string[];
  /** Flags for every prefill and decode engine, besides their ports, ids and registry. */
  engines: string[];
  /** The front door the user asked for; null: 127.0.0.1:8000, or a free port when that is busy. */
  httpListen: string | null;
  /** The registry address the user asked for; null: a free loopback port. */
  registryListen: string | null;
}

const flag = (key: string) => `--${key.replaceAll("_", "-")}`;

/** An option as argv: a list repeats its flag, a boolean is `--flag=true|false`, the rest `--flag value`. */
function asArgs(key: string, value: unknown): string[] {
  if (Array.isArray(value)) return value.flatMap((v) => [flag(key), String(v)]);
  if (typeof value === "boolean") return [`${flag(key)}=${value}`];
  return [flag(key), String(value)];
}

/**
 * The flags each of the cluster's processes gets from the options given to `engine
 * cluster` (on the command line or in its --config file): the gateway takes an option
 * from [gateway] when that was set, else from [engine]; engines take [engine]'s.
 * Throws a ConfigError naming the first option the cluster refuses.
 */
export function clusterFlags(config: Config): ClusterFlags {
  const out: ClusterFlags = { gateway: [], engines: [], httpListen: null, registryListen: null };
  const keys = new Set([...config.given].map((g) => g.slice(g.indexOf(".") + 1)));
  for (const key of SPECS.map((s) => s.key).filter((k, i, all) => all.indexOf(k) === i)) {
    if (!keys.has(key)) continue;
    const rule = CLUSTER_OPTIONS[key] ?? { refuse: "engine cluster has no use for it" };
    if (typeof rule === "object") throw new ConfigError(`${flag(key)} is not accepted by engine cluster: ${rule.refuse}`);
    const engineValue = config.given.has(`engine.${key}`) ? config.engine[key] : undefined;
    const gatewayValue = config.given.has(`gateway.${key}`) ? config.gateway[key] : engineValue;
    if (key === "http_listen") out.httpListen = String(gatewayValue);
    else if (key === "registry_listen") out.registryListen = String(gatewayValue);
    else {
      if (rule !== "engines" && gatewayValue !== undefined) out.gateway.push(...asArgs(key, gatewayValue));
      if (rule !== "gateway" && engineValue !== undefined) out.engines.push(...asArgs(key, engineValue));
    }
  }
  for (const addr of [out.httpListen, out.registryListen]) if (addr !== null) parseAddr(addr);
  if (!keys.has("heartbeat_interval_ms")) {
    for (const list of [out.gateway, out.engines]) list.push(flag("heartbeat_interval_ms"), String(CLUSTER_BEAT_MS));
  }
  return out;
}
