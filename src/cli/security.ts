import { log } from "../obs/index.ts";
import { speaksFor, type PeerRole } from "../rpc/peer-identity.ts";
import { TlsConfigError, TlsSource } from "../rpc/tls-config.ts";
import { apiKeysFrom } from "../http/front-door.ts";
import type { HttpListenerOptions } from "../http/index.ts";
import { ConfigError, type EngineConfig, type GatewayConfig } from "./options.ts";
import { quote } from "../codec/index.ts";

export type TlsMode = "mtls" | "plaintext";

/** What one process's [engine] or [gateway] section says about TLS, keys and bounds, checked. */
export interface Security {
  tls: TlsSource | null;
  mode: TlsMode;
  apiKeys: string[];
  metricsNeedKey: boolean;
  maxRequestBytes: number;
  /** The HTTP listener's slow-client bounds (serve-http.ts). */
  http: { headersTimeoutS: number; bodyTimeoutS: number; maxConnections: number; healthReserve: number };
}

/** 127.0.0.0/8, ::1 and localhost: the only hosts plaintext may bind without --insecure. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return h === "localhost" || h === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) || /^::ffff:127\./.test(h);
}

/**
 * Reads the security options of `section` for a process of `role` that binds `hosts`.
 * Refuses (ConfigError, before anything listens): a partial tls_* set, a certificate
 * naming another role or worker id, and a non-loopback bind without TLS unless
 * `insecure` is set.
 */
export function securityFrom(section: EngineConfig | GatewayConfig, role: PeerRole, hosts: readonly string[], workerId?: string): Security {
  const files = { cert: section.tls_cert, key: section.tls_key, ca: section.tls_ca };
  const given = [files.cert, files.key, files.ca].filter((f) => f !== "").length;
  if (given !== 0 && given !== 3) throw new ConfigError("tls_cert, tls_key and tls_ca go together: give all three or none");
  let tls: TlsSource | null = null;
  if (given === 3) {
    try {
      tls = new TlsSource(files, { onError: (e) => log.warn("tls files changed but were not loaded; keeping the previous set", { error: e.message }) });
    } catch (e) {
      if (e instanceof TlsConfigError) throw new ConfigError(e.message);
      throw e;
    }
    const self = tls.current.self;
    if (self.role !== role) throw new ConfigError(`tls_cert ${files.cert} names role ${self.role}; this process runs as ${role}`);
    if (workerId && !speaksFor(self, workerId))
      throw new ConfigError(
        `worker_id ${quote(workerId)} differs from the certificate's ${quote(self.workerId)} (the registry only takes heartbeats for the certificate's own id)`,
      );
  }
  const open = hosts.filter((h) => !isLoopback(h));
  if (tls === null && open.length > 0) {
    if (section.insecure !== true) {
      throw new ConfigError(`refusing to listen on ${open[0]} without TLS: give tls_cert, tls_key and tls_ca (\`engine certs\` mints them), or --insecure`);
    }
    log.warn("internal ports listen in plaintext beyond loopback (--insecure)", { hosts: open });
  }
  return {
    tls,
    mode: tls === null ? "plaintext" : "mtls",
    apiKeys: apiKeysFrom(section.api_key),
    metricsNeedKey: section.metrics_need_key,
    maxRequestBytes: section.max_request_bytes,
    http: httpLimitsFrom(section),
  };
}

function httpLimitsFrom(section: EngineConfig | GatewayConfig): Security["http"] {
  const http = {
    headersTimeoutS: section.http_headers_timeout_s,
    bodyTimeoutS: section.http_body_timeout_s,
    maxConnections: section.http_max_connections,
    healthReserve: section.http_health_reserve,
  };
  if (http.healthReserve >= http.maxConnections)
    throw new ConfigError(`http_health_reserve (${http.healthReserve}) must be below http_max_connections (${http.maxConnections})`);
  return http;
}

/** An HTTP listener's bounds from its section's options (the API keys come with the section's security). */
export function httpListener(s: EngineConfig | GatewayConfig) {
  return {
    maxRequestBytes: s.max_request_bytes,
    headersTimeoutS: s.http_headers_timeout_s,
    bodyTimeoutS: s.http_body_timeout_s,
    maxConnections: s.http_max_connections,
    healthReserve: s.http_health_reserve,
  } satisfies HttpListenerOptions;
}
