import { Role } from "../gen/tl/control/v1/control_pb.ts";
import { quote } from "../codec/index.ts";
import { type CompletionKind, detokenizeRoute, errorResponse, HttpError, tokenizeRoute } from "../http/index.ts";
import type { ChatRenderer, Tokenizer } from "../tokenizer/index.ts";
import { type Metrics, metricsResponse } from "../obs/index.ts";
import type { Admission } from "./admission.ts";
import type { Completions } from "./completions.ts";
import type { WorkerRegistry } from "./worker-registry.ts";

export interface GatewayRoutesContext {
  modelName: string;
  maxModelLen: number;
  /** /tokenize and /detokenize answer with the gateway's own tokenizer and template (it reads no weights). */
  tokenizer: Tokenizer;
  chat?: ChatRenderer;
  registry: WorkerRegistry;
  metrics: Metrics;
  admission: Admission;
  completions: Completions;
  /** What /health reports as the internal ports' mode. */
  tls?: "mtls" | "plaintext";
}

const ROLES = [
  ["prefill", Role.PREFILL],
  ["decode", Role.DECODE],
  ["both", Role.BOTH],
] as const;

/**
 * The gateway reads no weights: what the engines serving its model report of theirs (parameters,
 * stored dtype, resident bytes; WorkerStatus fields 17-19), as engines list them in their own
 * /v1/models. The first live engine that reports them; none yet: the fields are left out.
 */
function modelStats(registry: WorkerRegistry): Record<string, unknown> {
  const s = registry.live().find((w) => w.status.dtype !== "")?.status;
  return s ? { parameters: Number(s.parameters), dtype: s.dtype, resident_bytes: Number(s.residentBytes) } : {};
}

/** The gateway's HTTP: the OpenAI completions (admitted unless draining), models, health, metrics. */
export function gatewayRoutes(ctx: GatewayRoutesContext): (req: Request) => Promise<Response> {
  const { admission } = ctx;
  async function completion(req: Request, kind: CompletionKind): Promise<Response> {
    if (admission.isDraining) throw new HttpError(503, "gateway is draining", "server_error", null, { "retry-after": "1" });
    // Counted until the request log saw the last token, or until complete() fails.
    admission.enter();
    try {
      return await ctx.completions.complete(req, kind);
    } catch (e) {
      admission.leave();
      throw e;
    }
  }
  const liveCount = (r: Role) => ctx.registry.live().filter((w) => w.status.role === r).length;
  return async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    try {
      const kind = req.method !== "POST" ? null : url.pathname === "/v1/completions" ? "completion" : url.pathname === "/v1/chat/completions" ? "chat" : null;
      if (kind) return await completion(req, kind);
      if (req.method === "POST" && url.pathname === "/tokenize") return await tokenizeRoute(req, ctx);
      if (req.method === "POST" && url.pathname === "/detokenize") return await detokenizeRoute(req, ctx);
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return Response.json({
          object: "list",
          data: [{ id: ctx.modelName, object: "model", created: 0, owned_by: "tl-engine", max_model_len: ctx.maxModelLen, ...modelStats(ctx.registry) }],
        });
      }
      if (req.method === "GET" && url.pathname === "/health") {
        // Readiness: 503 while draining, and until the registry holds what a request needs (a
        // prefill and a decode engine, or a both engine), so a Service sends clients only to a
        // gateway that can serve them. Liveness is /health/live.
        const workers = { prefill: liveCount(Role.PREFILL), decode: liveCount(Role.DECODE), both: liveCount(Role.BOTH) };
        const canServe = workers.both > 0 || (workers.prefill > 0 && workers.decode > 0);
        const status = admission.isDraining ? "draining" : canServe ? "ok" : "no_engines";
        return Response.json({ status, workers, tls: ctx.tls ?? "plaintext" }, { status: status === "ok" ? 200 : 503 });
      }
      // Liveness stays up while draining.
      if (req.method === "GET" && url.pathname === "/health/live") return Response.json({ status: "alive" });
      if (req.method === "GET" && url.pathname === "/metrics") {
        for (const [name, r] of ROLES) ctx.metrics.registryWorkers.set({ role: name }, liveCount(r));
        return metricsResponse(ctx.metrics);
      }
      throw new HttpError(404, `no route for ${req.method} ${quote(url.pathname)}`, "not_found_error");
    } catch (e) {
      return errorResponse(e);
    }
  };
}
