import { Role } from "../gen/tl/control/v1/control_pb.ts";
import { quote } from "../codec/index.ts";
import { type CompletionKind, errorResponse, HttpError } from "../http/index.ts";
import { type Metrics, metricsResponse } from "../obs/index.ts";
import type { Admission } from "./admission.ts";
import type { Completions } from "./completions.ts";
import type { WorkerRegistry } from "./worker-registry.ts";

export interface GatewayRoutesContext {
  modelName: string;
  maxModelLen: number;
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
      if (req.method === "GET" && url.pathname === "/v1/models") {
        return Response.json({
          object: "list",
          data: [{ id: ctx.modelName, object: "model", created: 0, owned_by: "tl-engine", max_model_len: ctx.maxModelLen }],
        });
      }
      if (req.method === "GET" && url.pathname === "/health") {
        // Readiness: 503 while draining, so a Service stops sending it clients.
        const draining = admission.isDraining;
        return Response.json(
          {
            status: draining ? "draining" : "ok",
            workers: { prefill: liveCount(Role.PREFILL), decode: liveCount(Role.DECODE), both: liveCount(Role.BOTH) },
            tls: ctx.tls ?? "plaintext",
          },
          { status: draining ? 503 : 200 },
        );
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
