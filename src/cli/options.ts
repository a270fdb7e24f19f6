import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { quote } from "../codec/index.ts";
import { parseRegistryTargets } from "../control/gateway-beats.ts";

export type Role = "prefill" | "decode" | "both" | "gateway";
export const ROLES: readonly Role[] = ["prefill", "decode", "both", "gateway"];

type Kind = "string" | "addr" | "addr?" | "gateways?" | "host?" | "url?" | "int" | "uint" | "num" | "bool" | "list" | "choice";
type Value = string | number | boolean | readonly string[];

interface Spec {
  section: "engine" | "gateway";
  key: string;
  kind: Kind;
  dflt: Value;
  help: string;
  /** How --help shows a default that is not a fixed value (the machine's cores, the model's context). */
  dfltText?: string;
  /** The values a "choice" takes. */
  choices?: readonly string[];
}

/** The peer-check and front-door options, the same in both sections. */
const SECURITY_OPTIONS = [
  {
    key: "tls_cert",
    kind: "string",
    dflt: "",
    help: "PEM certificate naming this process (spiffe://tl-engine/<role>/<id>); with tls_key and tls_ca: mutual TLS on every internal port",
  },
  { key: "tls_key", kind: "string", dflt: "", help: "PEM private key of tls_cert" },
  { key: "tls_ca", kind: "string", dflt: "", help: "PEM cluster CA every peer's certificate must chain to" },
  { key: "insecure", kind: "bool", dflt: false, help: "allow plaintext internal ports on a non-loopback address" },
  { key: "api_key", kind: "list", dflt: [], help: "Bearer key required on the HTTP API (repeatable; TL_API_KEY also read, comma-separated)" },
  { key: "metrics_need_key", kind: "bool", dflt: false, help: "put /metrics behind the API key too" },
  { key: "max_request_bytes", kind: "int", dflt: 4194304, help: "largest HTTP request body (413 beyond it)" },
  // Slow clients bounded as other servers bound them (nginx: 60 s for headers and body; Go's
  // http.Server ReadHeaderTimeout as most set it, 30 s).
  {
    key: "http_headers_timeout_s",
    kind: "int",
    dflt: 30,
    help: "seconds an HTTP client has to send a request's headers (408 after)",
  },
  {
    key: "http_body_timeout_s",
    kind: "int",
    dflt: 60,
    help: "seconds an HTTP client has to send a request's whole body (408 after)",
  },
  {
    key: "http_max_connections",
    kind: "int",
    dflt: 2048,
    help: "most HTTP client connections open at once (more are closed unread; each holds two descriptors)",
  },
  {
    key: "http_health_reserve",
    kind: "uint",
    dflt: 64,
    help: "of http_max_connections, how many only /health and /health/live may take (others get 503 past the rest)",
  },
] as const satisfies readonly Omit<Spec, "section">[];

function securityOptions<S extends Spec["section"]>(section: S) {
  return SECURITY_OPTIONS.map((o) => ({ ...o, section }));
}

/**
 * Every option, as a TOML key under its section and as a --flag (key with dashes), with its
 * default: the only place a default is written. The library (Engine, startGateway, the
 * registry) takes every value from its caller; engine-node and the gateway's wiring fill what a
 * caller leaves out from here (ENGINE_DEFAULTS, GATEWAY_CONFIG_DEFAULTS).
 */
export const SPECS = [
  { section: "engine", key: "worker_id", kind: "string", dflt: "", dfltText: "role-hostname-pid", help: "worker id reported to the gateway" },
  { section: "engine", key: "http_listen", kind: "addr", dflt: "127.0.0.1:8100", help: "OpenAI-compatible HTTP server" },
  { section: "engine", key: "grpc_listen", kind: "addr", dflt: "127.0.0.1:50051", help: "EngineControl (tl.engine.v1) gRPC server" },
  { section: "engine", key: "kv_listen", kind: "addr", dflt: "127.0.0.1:50061", help: "KvTransfer (tl.kv.v1) gRPC server; decode and both roles" },
  { section: "engine", key: "kv_data_listen", kind: "addr?", dflt: "", help: "binary KV data plane beside KvTransfer; empty: a port the OS picks" },
  {
    section: "engine",
    key: "advertise_host",
    kind: "host?",
    dflt: "",
    help: "host other processes reach this engine at (e.g. a pod IP); empty: the host it binds",
  },
  {
    section: "engine",
    key: "kv_events",
    kind: "bool",
    dflt: true,
    help: "report the KV blocks this engine stores and evicts in its beats (the gateways' prefix index routes on them); false: gateways infer from their own routing",
  },
  {
    section: "engine",
    key: "gateway_registry",
    kind: "gateways?",
    dflt: "",
    help: "the gateways' WorkerRegistry: host:port, comma-separated for several, dns:host:port re-resolved every beat to all its addresses; empty: no heartbeat",
  },
  {
    section: "engine",
    key: "model",
    kind: "string",
    dflt: "",
    help: "a Hugging Face model folder, a GGUF file or a llama2.c .bin; empty: the embedded tl-kjv-small; tl-synthetic-4l: the seeded random model",
  },
  { section: "engine", key: "tokenizer", kind: "string", dflt: "", help: "llama2.c tokenizer.bin (only with a llama2.c model)" },
  {
    section: "engine",
    key: "served_model_name",
    kind: "string",
    dflt: "",
    help: "the name /v1/models lists and requests must give; empty: the model's folder or file name",
  },
  {
    section: "engine",
    key: "chat_template",
    kind: "string",
    dflt: "",
    help: "Jinja chat template file overriding the model's; empty: the model's, else <|role|> lines",
  },
  {
    section: "engine",
    key: "tool_call_parser",
    kind: "choice",
    choices: ["", "hermes", "llama3_json"],
    dflt: "",
    help: 'how tool_choice "auto" reads tool calls from the output (vLLM\'s names); empty: what the chat template shows',
  },
  {
    section: "engine",
    key: "dtype",
    kind: "choice",
    choices: ["as-stored", "f32", "f16", "bf16", "q8_0"],
    dflt: "as-stored",
    help: "weights in memory: f32, f16, bf16 or q8_0 (quantized at load); as-stored keeps the file's (llama2.c: f32)",
  },
  {
    section: "engine",
    key: "threads",
    kind: "int",
    dflt: availableParallelism(),
    dfltText: `all cores (${availableParallelism()} here)`,
    help: "threads the model's matmuls split over",
  },
  {
    section: "engine",
    key: "huge_pages",
    kind: "bool",
    dflt: true,
    help: "ask Linux for 2 MiB pages for the kernels' memory (faster decode where transparent huge pages are on, slower first touch on some hosts); --huge-pages=false: 4 KiB pages",
  },
  {
    section: "engine",
    key: "model_thread",
    kind: "choice",
    choices: ["worker", "main"],
    dflt: "worker",
    help: "where forward passes run: worker (a thread of their own, so HTTP, gRPC, KV pushes and heartbeats never wait on the model) or main (the event loop)",
  },
  { section: "engine", key: "block_tokens", kind: "int", dflt: 16, help: "tokens per KV block" },
  { section: "engine", key: "num_blocks", kind: "int", dflt: 2048, help: "KV pool capacity in blocks" },
  {
    section: "engine",
    key: "max_model_len",
    kind: "uint",
    dflt: 0,
    dfltText: "the model's context (256 for the embedded tl-kjv-small)",
    help: "prompt + output tokens per request, at most the model's context; 0: the model's context",
  },
  { section: "engine", key: "max_batch_tokens", kind: "int", dflt: 256, help: "tokens per engine step (prefill chunks + decodes)" },
  { section: "engine", key: "handle_ttl_s", kind: "int", dflt: 60, help: "seconds a pushed KV handle waits to be claimed" },
  { section: "engine", key: "push_idle_timeout_ms", kind: "int", dflt: 10000, help: "a KV push that sends nothing this long is aborted and its blocks freed" },
  { section: "engine", key: "heartbeat_interval_ms", kind: "int", dflt: 2000, help: "beat interval toward the gateway" },
  { section: "engine", key: "heartbeat_timeout_ms", kind: "int", dflt: 1000, help: "timeout of one beat" },
  {
    section: "engine",
    key: "otlp_endpoint",
    kind: "url?",
    dflt: "",
    help: "OTLP/HTTP collector (e.g. http://127.0.0.1:4318) for traces; empty: OTEL_EXPORTER_OTLP_ENDPOINT, else tracing off",
  },
  { section: "engine", key: "drain_timeout_s", kind: "num", dflt: 30, help: "on SIGTERM, seconds (fractions too) to finish in-flight work" },
  ...securityOptions("engine"),
  ...securityOptions("gateway"),
  {
    section: "gateway",
    key: "routing_headers",
    kind: "bool",
    dflt: false,
    help: "tell clients which workers served them (x-tl-prefill-worker, x-tl-decode-worker): debugging only",
  },
  { section: "gateway", key: "max_workers", kind: "int", dflt: 256, help: "most workers the registry holds (heartbeats of more are refused)" },
  {
    section: "gateway",
    key: "prefix_index_max_blocks",
    kind: "int",
    dflt: 1048576,
    help: "most blocks the prefix index holds from engines' KV events; beyond it the least recently reported are forgotten",
  },
  { section: "gateway", key: "http_listen", kind: "addr", dflt: "127.0.0.1:8000", help: "OpenAI-compatible front door" },
  { section: "gateway", key: "registry_listen", kind: "addr", dflt: "127.0.0.1:50050", help: "WorkerRegistry (tl.control.v1) gRPC server" },
  { section: "gateway", key: "model", kind: "string", dflt: "", help: "model the gateway tokenizes for; as [engine] model" },
  { section: "gateway", key: "tokenizer", kind: "string", dflt: "", help: "as [engine] tokenizer" },
  { section: "gateway", key: "served_model_name", kind: "string", dflt: "", help: "as [engine] served_model_name" },
  { section: "gateway", key: "chat_template", kind: "string", dflt: "", help: "as [engine] chat_template (must match the engines')" },
  { section: "gateway", key: "tool_call_parser", kind: "choice", choices: ["", "hermes", "llama3_json"], dflt: "", help: "as [engine] tool_call_parser" },
  {
    section: "gateway",
    key: "max_model_len",
    kind: "uint",
    dflt: 0,
    dfltText: "the model's context",
    help: "as [engine] max_model_len (a vocabulary-only GGUF without a context length needs it)",
  },
  { section: "gateway", key: "drain_timeout_s", kind: "num", dflt: 30, help: "on SIGTERM, seconds (fractions too) to let in-flight requests finish" },
  { section: "gateway", key: "heartbeat_interval_ms", kind: "int", dflt: 2000, help: "interval engines are told to beat at" },
  { section: "gateway", key: "otlp_endpoint", kind: "url?", dflt: "", help: "as [engine] otlp_endpoint" },
  {
    section: "gateway",
    key: "route_overlap_weight",
    kind: "num",
    dflt: 1,
    help: "decode cost per prompt block the engine lacks (cost = this × uncached blocks + route_load_weight × requests)",
  },
  { section: "gateway", key: "route_load_weight", kind: "num", dflt: 8, help: "decode cost per request running on the engine, in blocks" },
  { section: "gateway", key: "prefill_timeout_ms", kind: "int", dflt: 60000, help: "deadline of one Prefill (P's prefill and push)" },
  { section: "gateway", key: "first_byte_timeout_ms", kind: "int", dflt: 30000, help: "deadline for an engine stream's first event" },
  { section: "gateway", key: "inter_token_timeout_ms", kind: "int", dflt: 10000, help: "deadline between two events of an engine stream" },
  {
    section: "gateway",
    key: "stall_suspect_ms",
    kind: "int",
    dflt: 1000,
    help: "a gap this long between two events makes the engine suspect (new work routes around it) without ending the stream",
  },
  { section: "gateway", key: "suspect_cooldown_ms", kind: "int", dflt: 10000, help: "how long an engine that missed a deadline is routed around" },
  {
    section: "gateway",
    key: "disagg_min_uncached_tokens",
    kind: "uint",
    // bench/routing.ts, 3 runs on a shared 2-core machine with the decode engine busy: below 256
    // tokens disaggregated TTFT loses 1.5-5×; at 512 it reaches parity (ratios 0.68, 1.03, 1.42).
    dflt: 512,
    help: "prefill on the decode engine itself when fewer prompt tokens than this are uncached there; 0: always disaggregate",
  },
] as const satisfies readonly Spec[];

type AnySpec = (typeof SPECS)[number];
type ValueOf<K extends Kind> = K extends "int" | "uint" | "num" ? number : K extends "bool" ? boolean : K extends "list" ? readonly string[] : string;
/** One section's options as SPECS types them: a key for each option, its value's type from its kind. */
type SectionConfig<S extends Spec["section"]> = {
  [O in Extract<AnySpec, { section: S }> as O["key"]]: O extends { choices: readonly (infer C)[] } ? C : ValueOf<O["kind"]>;
};
/** [engine], typed from SPECS (issue 24's typed configuration): a new option is a new field here. */
export type EngineConfig = SectionConfig<"engine">;
/** [gateway], typed from SPECS. */
export type GatewayConfig = SectionConfig<"gateway">;

export type Section = Record<string, Value>;
export interface Config {
  role: Role;
  engine: EngineConfig & Section;
  gateway: GatewayConfig & Section;
  /** "section.key" of every option the config file or a flag set (the rest are defaults). */
  given: Set<string>;
}

export class ConfigError extends Error {}

export function defaults(): Config {
  const engine: Section = {};
  const gateway: Section = {};
  for (const s of SPECS as readonly Spec[]) (s.section === "engine" ? engine : gateway)[s.key] = s.dflt;
  return { role: "both", engine: engine as Config["engine"], gateway: gateway as Config["gateway"], given: new Set() };
}

/** Every [engine] default, typed: what engine-node uses for an option its caller left out. */
export const ENGINE_DEFAULTS: Readonly<EngineConfig> = defaults().engine;
/** Every [gateway] default, typed. */
export const GATEWAY_CONFIG_DEFAULTS: Readonly<GatewayConfig> = defaults().gateway;

function coerce(spec: Spec, raw: unknown, where: string): Value {
  const name = `${where} ${spec.section}.${spec.key}`;
  if (spec.kind === "bool") {
    const b = raw === "true" || raw === "" ? true : raw === "false" ? false : raw;
    if (typeof b !== "boolean") throw new ConfigError(`${name}: want true or false, got ${quote(raw)}`);
    return b;
  }
  if (spec.kind === "list") {
    const list = typeof raw === "string" ? [raw] : raw;
    if (!Array.isArray(list) || !list.every((v) => typeof v === "string" && v !== ""))
      throw new ConfigError(`${name}: want a non-empty string or a list of them, got ${quote(raw)}`);
    return list as string[];
  }
  if (spec.kind === "int") {
    const n = typeof raw === "string" && /^\d+$/.test(raw) ? Number(raw) : raw;
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 1) throw new ConfigError(`${name}: want a positive integer, got ${quote(raw)}`);
    return n;
  }
  if (spec.kind === "uint" || spec.kind === "num") {
    const n = typeof raw === "string" && /^\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw;
    const ok = typeof n === "number" && Number.isFinite(n) && n >= 0 && (spec.kind === "num" || Number.isSafeInteger(n));
    if (!ok) throw new ConfigError(`${name}: want ${spec.kind === "num" ? "a number" : "an integer"} ≥ 0, got ${quote(raw)}`);
    return n as number;
  }
  if (typeof raw !== "string") throw new ConfigError(`${name}: want a string, got ${quote(raw)}`);
  if (spec.kind === "choice" && !spec.choices!.includes(raw)) throw new ConfigError(`${name}: want one of ${spec.choices!.join(", ")}, got ${quote(raw)}`);
  if (spec.kind === "addr" || (spec.kind === "addr?" && raw !== "")) parseAddr(raw, name);
  if (spec.kind === "gateways?" && raw !== "") {
    const entries = raw.split(",").map((x) => x.trim());
    if (entries.some((x) => x === "")) throw new ConfigError(`${name}: an empty entry in ${JSON.stringify(raw)}`);
    for (const x of entries) parseAddr(x.startsWith("dns:") ? x.slice(4) : x, name);
    try {
      parseRegistryTargets(raw);
    } catch (e) {
      throw new ConfigError(`${name}: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  if (spec.kind === "host?" && raw !== "") {
    const ok = /^([A-Za-z0-9.-]+|[0-9a-fA-F]*:[0-9a-fA-F:]*:[0-9a-fA-F.]*)$/.test(raw) && !["0.0.0.0", "::"].includes(raw);
    if (!ok) throw new ConfigError(`${name}: want a host name or IP address others can reach, got ${quote(raw)}`);
  }
  if (spec.kind === "url?" && raw !== "" && !/^https?:\/\/[^/\s]+/.test(raw))
    throw new ConfigError(`${name}: want an http:// or https:// URL, got ${quote(raw)}`);
  return raw;
}

/** "host:port" with a port in 0..65535; "[::1]:80" for IPv6. */
export function parseAddr(s: string, name = "address"): { host: string; port: number } {
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(s);
  if (!m || Number(m[2]) > 65535) throw new ConfigError(`${name}: want host:port, got ${quote(s)}`);
  return { host: m[1]!.replace(/^\[|\]$/g, ""), port: Number(m[2]) };
}

/** Applies a TOML file: only [engine] and [gateway] tables with known keys. */
function applyToml(c: Config, path: string): void {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new ConfigError(`config ${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
  let doc: Record<string, unknown>;
  try {
    doc = Bun.TOML.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw new ConfigError(`config ${path}: not valid TOML: ${e instanceof Error ? e.message : String(e)}`);
  }
  for (const [table, body] of Object.entries(doc)) {
    if (table !== "engine" && table !== "gateway") throw new ConfigError(`config ${path}: unknown key ${quote(table)} (tables are [engine] and [gateway])`);
    if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ConfigError(`config ${path}: ${table} must be a table`);
    for (const [key, value] of Object.entries(body)) {
      const spec = SPECS.find((s) => s.section === table && s.key === key);
      if (!spec) throw new ConfigError(`config ${path}: unknown key ${quote(`${table}.${key}`)}`);
      c[table][key] = coerce(spec, value, `config ${path}:`);
      c.given.add(`${table}.${key}`);
    }
  }
}

/** Subcommand flags that take no value (`engine cluster --plaintext`). */
const STANDALONE_FLAGS = new Set(["plaintext", "per-role"]);
/** Subcommand flags that take one (`engine cluster --prefill N`, `engine certs --out DIR`, `engine generate --prompt TEXT`), and --role, --config. */
const SUBCOMMAND_FLAGS = new Set([
  "role",
  "config",
  "prefill",
  "decode",
  "both",
  "gateway",
  "admin",
  "out",
  "dns",
  "ip",
  "days",
  "prompt",
  "max-tokens",
  "temperature",
  "seed",
]);

/**
 * Flags override the config file. `--http-listen` and the other keys both sections
 * have go to [gateway] for the gateway role and to [engine] otherwise.
 */
export function parseArgs(argv: readonly string[]): { config: Config; rest: Map<string, string>; help: boolean; version: boolean } {
  const flags = new Map<string, string>();
  const lists = new Map<string, string[]>();
  const kindOf = (name: string) => (STANDALONE_FLAGS.has(name) ? "bool" : SPECS.find((s) => s.key === name.replaceAll("-", "_"))?.kind);
  let help = false;
  let version = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--help" || a === "-h") {
      help = true;
      continue;
    }
    if (a === "--version") {
      version = true;
      continue;
    }
    if (!a.startsWith("--")) throw new ConfigError(`unexpected argument ${quote(a)}`);
    const eq = a.indexOf("=");
    const name = eq >= 0 ? a.slice(2, eq) : a.slice(2);
    // A boolean flag stands alone (`--insecure`) unless written `--insecure=false`.
    const value = eq >= 0 ? a.slice(eq + 1) : kindOf(name) === "bool" ? "true" : argv[++i];
    // A flag no option has, last on the line, is unknown (not short of a value); subcommands'
    // own flags (cluster --prefill N, certs --out DIR) come with their values.
    if (value === undefined)
      throw new ConfigError(kindOf(name) === undefined && !SUBCOMMAND_FLAGS.has(name) ? `unknown option --${name}` : `--${name} needs a value`);
    if (kindOf(name) === "list") lists.set(name, [...(lists.get(name) ?? []), value]);
    else flags.set(name, value);
  }
  const config = defaults();
  const role = flags.get("role");
  if (role !== undefined) {
    if (!ROLES.includes(role as Role)) throw new ConfigError(`--role ${quote(role)}: want one of ${ROLES.join(", ")}`);
    config.role = role as Role;
  }
  flags.delete("role");
  const file = flags.get("config");
  flags.delete("config");
  if (file !== undefined) applyToml(config, file);
  const rest = new Map<string, string>();
  for (const [name, value] of [...flags, ...lists] as [string, string | string[]][]) {
    const key = name.replaceAll("-", "_");
    const prefer = config.role === "gateway" ? "gateway" : "engine";
    const spec = SPECS.find((s) => s.key === key && s.section === prefer) ?? SPECS.find((s) => s.key === key);
    if (!spec) {
      rest.set(name, String(value));
      continue;
    }
    config[spec.section][key] = coerce(spec, value, `--${name}:`);
    config.given.add(`${spec.section}.${key}`);
  }
  return { config, rest, help, version };
}

export function helpText(): string {
  const lines = [
    "tl-engine: disaggregated prefill/decode LLM serving",
    "",
    "usage:",
    "  engine --role prefill|decode|both|gateway [--config FILE.toml] [--option value ...]",
    "  engine cluster [--prefill N] [--decode M] [--gateways G] [--model PATH [--tokenizer PATH]] [--served-model-name NAME]",
    "                 [--plaintext] [--api-key KEY] (internal ports run mutual TLS with an ephemeral CA unless --plaintext)",
    "  engine certs --out DIR [--gateway N] [--prefill N] [--decode N] [--both N] [--admin N] [--dns NAMES] [--ip ADDRS] [--days D] [--per-role]",
    "  engine generate [--model PATH [--tokenizer PATH]] --prompt TEXT [--max-tokens N] [--temperature T] [--seed S]",
    "",
    "options (TOML key under [section]; flags override the file; the gateway role reads [gateway]):",
  ];
  for (const s of SPECS) {
    const flag = `--${s.key.replaceAll("_", "-")}`;
    const dflt = (s as Spec).dfltText ?? JSON.stringify(s.dflt);
    lines.push(`  [${s.section}] ${s.key.padEnd(22)} ${flag.padEnd(26)} ${s.help} (default: ${dflt})`);
  }
  lines.push(
    "",
    '  --role ROLE        prefill | decode | both | gateway (default: "both")',
    "  --config FILE      TOML file with [engine] and [gateway] tables",
    "  --help             this text",
    "  --version          the engine's version",
  );
  return lines.join("\n");
}
