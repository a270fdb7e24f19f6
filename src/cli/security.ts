import { log } from "../obs/index.ts";
import { speaksFor, type PeerRole } from "../rpc/peer-identity.ts";
import { TlsConfigError, TlsSource } from "../rpc/tls-config.ts";
import { apiKeysFrom } from "../http/front-door.ts";
import { HTTP_LIMITS } from "../http/index.ts";
import { ConfigError, type Section } from "./options.ts";
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
export function securityFrom(section: Section, role: PeerRole, hosts: readonly string[], workerId?: string): Security {
  const files = { cert: String(section.tls_cert ?? ""), key: String(section.tls_key ?? ""), ca: String(section.tls_ca ?? "") };
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
    apiKeys: apiKeysFrom((section.api_key as readonly string[] | undefined) ?? []),
    metricsNeedKey: section.metrics_need_key === true,
    maxRequestBytes: Number(section.max_request_bytes ?? 4 * 1024 * 1024),
    http: httpLimitsFrom(section),
  };
}

function httpLimitsFrom(section: Section): Security["http"] {
  const http = {
    headersTimeoutS: Number(section.http_headers_timeout_s ?? HTTP_LIMITS.headersTimeoutS),
    bodyTimeoutS: Number(section.http_body_timeout_s ?? HTTP_LIMITS.bodyTimeoutS),
    maxConnections: Number(section.http_max_connections ?? HTTP_LIMITS.maxConnections),
    healthReserve: Number(section.http_health_reserve ?? HTTP_LIMITS.healthReserve),
  };
  if (http.healthReserve >= http.maxConnections)
    throw new ConfigError(`http_health_reserve (${http.healthReserve}) must be below http_max_connections (${http.maxConnections})`);
  return http;
}
