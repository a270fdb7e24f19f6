import { createHash, timingSafeEqual } from "node:crypto";
import { errorResponse, HttpError } from "./errors.ts";
import { quote } from "../codec/index.ts";

export type Handler = (req: Request) => Promise<Response> | Response;

export interface FrontDoorOptions {
  /** Bearer keys accepted on /v1/* (vLLM's --api-key); none: the door is open. */
  apiKeys?: readonly string[];
  /** Put /metrics behind the key as well (default: open, like /health). */
  metricsNeedKey?: boolean;
  /** Largest request body; a larger one gets 413 before any handler reads it (max_request_bytes). */
  maxRequestBytes: number;
  /** Seconds a request's whole body may take to arrive (408 after): http_body_timeout_s. */
  bodyTimeoutS: number;
  /** Told when a request's body starts being read and when its response starts (the server's idle timeouts follow). */
  phase?: (req: Request, phase: "body" | "response") => void;
}

/**
 * Every HTTP request passes here before routing: the API key on every path but
 * /health, /health/live (and /metrics unless asked), then the body: judged by its Content-Length or,
 * chunked, by its count, and read here whole within the body deadline, so a handler
 * never waits on a client's bytes.
 */
export function frontDoor(handler: Handler, opts: FrontDoorOptions): Handler {
  const keys = (opts.apiKeys ?? []).filter((k) => k !== "").map(digest);
  const max = opts.maxRequestBytes;
  const deadlineMs = opts.bodyTimeoutS * 1000;
  const phase = opts.phase ?? (() => {});
  return async (req) => {
    if (keys.length > 0 && needsKey(new URL(req.url).pathname, opts.metricsNeedKey === true) && !authorized(req, keys)) {
      phase(req, "response");
      return errorResponse(
        new HttpError(401, "missing or invalid API key: send Authorization: Bearer <key>", "authentication_error", null, {
          "www-authenticate": 'Bearer realm="tl-engine"',
        }),
      );
    }
    if (req.body === null) {
      phase(req, "response");
      return handler(req);
    }
    const declared = req.headers.get("content-length");
    if (declared !== null) {
      if (!/^\d+$/.test(declared)) return errorResponse(new HttpError(400, `content-length ${quote(declared)}: not a byte count`));
      if (Number(declared) > max) return tooLarge(`${declared} bytes`, max);
    }
    phase(req, "body");
    const body = await readBounded(req.body, max, deadlineMs);
    phase(req, "response");
    if (body === "late") return tooSlow(deadlineMs);
    if (body === null) return tooLarge("more bytes", max);
    // The same request (headers, abort signal) over the bytes already read.
    return handler(new Request(req, { body }));
  };
}

function tooSlow(deadlineMs: number): Response {
  return errorResponse(
    new HttpError(408, `request body not received within ${deadlineMs / 1000} s (body_timeout_s)`, "invalid_request_error", null, { connection: "close" }),
  );
}

function tooLarge(got: string, max: number): Response {
  return errorResponse(new HttpError(413, `request body of ${got} exceeds max_request_bytes (${max})`));
}

/** Reads a stream whole unless it exceeds `max` bytes (then null) or takes longer than `deadlineMs` ("late"); either way the stream is cancelled. */
async function readBounded(stream: ReadableStream<Uint8Array>, max: number, deadlineMs: number): Promise<Uint8Array | null | "late"> {
  const parts: Uint8Array[] = [];
  let have = 0;
  const reader = stream.getReader();
  let late = false;
  const timer = setTimeout(() => {
    late = true;
    reader.cancel().catch(() => {});
  }, deadlineMs);
  try {
    for (;;) {
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true }) as const);
      if (late) return "late";
      if (done) break;
      have += value.byteLength;
      if (have > max) {
        await reader.cancel().catch(() => {});
        return null;
      }
      parts.push(value);
    }
  } finally {
    clearTimeout(timer);
  }
  const out = new Uint8Array(have);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

// Hashing first gives equal-length inputs, so timingSafeEqual never leaks the key's length.
function digest(s: string): Buffer {
  return createHash("sha256").update(s).digest();
}

function authorized(req: Request, keys: readonly Buffer[]): boolean {
  const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.get("authorization") ?? "");
  if (!m) return false;
  const got = digest(m[1]!);
  let ok = false;
  // Every key is compared, so timing says nothing about which one matched.
  for (const k of keys) ok = timingSafeEqual(got, k) || ok;
  return ok;
}

// Only the probes are open; everything else (/v1/*, and any path a router might
// normalise into one) needs the key.
function needsKey(path: string, metricsNeedKey: boolean): boolean {
  // Kubernetes probes carry no credentials: readiness and liveness are both open.
  if (path === "/health" || path === "/health/live") return false;
  if (path === "/metrics") return metricsNeedKey;
  return true;
}

/** API keys from the option list plus TL_API_KEY (comma-separated). */
export function apiKeysFrom(list: readonly string[], env: string | undefined = process.env.TL_API_KEY): string[] {
  return [...list, ...(env ?? "").split(",")].map((k) => k.trim()).filter((k) => k !== "");
}
