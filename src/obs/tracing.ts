import {
  defaultTextMapGetter,
  defaultTextMapSetter,
  INVALID_SPAN_CONTEXT,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
  type TextMapGetter,
  type Tracer,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor, SimpleSpanProcessor, type SpanExporter } from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";

export { SpanKind, SpanStatusCode, type Attributes, type Context, type Span };

/** The W3C header (and gRPC metadata key, and data-plane TRACE frame body) that carries a span context. */
const TRACEPARENT = "traceparent";

export interface TracingOptions {
  /** service.name of every span this process exports (e.g. "tl-engine-decode"). */
  serviceName: string;
  /** OTLP/HTTP traces URL (tracingEndpoint() resolves config and env into one). */
  endpoint?: string;
  /** Export here instead, each span as it ends (tests: an InMemorySpanExporter). */
  exporter?: SpanExporter;
  /** More resource attributes, e.g. { "tl.role": "decode", "service.instance.id": workerId }. */
  attributes?: Attributes;
}

interface Active {
  provider: BasicTracerProvider;
  tracer: Tracer;
}

// Tracing off is the default and must cost nothing per request: every helper checks
// `active` first and, when it is null, touches neither the API nor the request.
let active: Active | null = null;
const propagator = new W3CTraceContextPropagator();
// What every helper hands out while off: one shared span that records nothing.
const NOOP_SPAN: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

const headersGetter: TextMapGetter<Headers> = {
  get: (h, key) => h.get(key) ?? undefined,
  keys: (h) => [...h.keys()],
};

/**
 * The OTLP/HTTP traces URL: the `otlp_endpoint` option if set, else
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is), else OTEL_EXPORTER_OTLP_ENDPOINT.
 * A base URL gets the standard `/v1/traces` path. undefined = tracing off.
 */
export function tracingEndpoint(option: string | undefined, env: Record<string, string | undefined> = process.env): string | undefined {
  const base = (u: string) => (/\/v1\/traces\/?$/.test(u) ? u : `${u.replace(/\/+$/, "")}/v1/traces`);
  if (option) return base(option);
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
  if (env.OTEL_EXPORTER_OTLP_ENDPOINT) return base(env.OTEL_EXPORTER_OTLP_ENDPOINT);
  return undefined;
}

/**
 * Registers a tracer provider for this process when there is somewhere to send spans
 * (`endpoint` or `exporter`); without either, tracing stays off and nothing is
 * registered. Returns the shutdown, which flushes and unregisters.
 */
export function setupTracing(opts: TracingOptions): () => Promise<void> {
  if (opts.endpoint === undefined && opts.exporter === undefined) return async () => {};
  if (active !== null) throw new Error(`tracing is already set up in this process (service ${opts.serviceName})`);
  // An in-memory exporter wants spans as they end; a collector wants batches.
  const processor = opts.exporter ? new SimpleSpanProcessor(opts.exporter) : new BatchSpanProcessor(new OTLPTraceExporter({ url: opts.endpoint! }));
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: opts.serviceName, ...opts.attributes }),
    spanProcessors: [processor],
  });
  trace.setGlobalTracerProvider(provider);
  propagation.setGlobalPropagator(propagator);
  const mine: Active = { provider, tracer: provider.getTracer("tl-engine") };
  active = mine;
  let down: Promise<void> | undefined;
  return () =>
    (down ??= (async () => {
      if (active === mine) {
        active = null;
        trace.disable();
        propagation.disable();
      }
      await provider.shutdown();
    })());
}

let shutdownHook: (() => Promise<void>) | undefined;

/** setupTracing, remembering the shutdown for shutdownTracing() (the CLI's exit path). */
export function startTracing(opts: TracingOptions): void {
  // Several roles in one process (tests, a colocated run) share the first one's provider.
  if (tracingEnabled()) return;
  const stop = setupTracing(opts);
  if (tracingEnabled()) shutdownHook = stop;
}

/** Flushes and stops what startTracing started, waiting at most `timeoutMs` for the collector. */
export async function shutdownTracing(timeoutMs = 3000): Promise<void> {
  const stop = shutdownHook;
  shutdownHook = undefined;
  if (!stop) return;
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([stop().catch(() => {}), new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))]);
  clearTimeout(timer);
}

export function tracingEnabled(): boolean {
  return active !== null;
}

/**
 * Starts a span under `parent`: a local span, a Context (from extractHeaders), a
 * `traceparent` value from the wire, or nothing (a new trace). Off: the shared no-op span.
 */
export function startSpan(name: string, kind: SpanKind, parent?: Span | Context | string | null, attributes?: Attributes): Span {
  if (active === null) return NOOP_SPAN;
  let ctx: Context;
  if (parent === undefined || parent === null || parent === "") ctx = ROOT_CONTEXT;
  else if (typeof parent === "string") ctx = propagator.extract(ROOT_CONTEXT, { [TRACEPARENT]: parent }, defaultTextMapGetter);
  else if ("spanContext" in parent) ctx = trace.setSpan(ROOT_CONTEXT, parent);
  else ctx = parent;
  return active.tracer.startSpan(name, { kind, attributes }, ctx);
}

/** HTTP headers / gRPC metadata carrying `span`'s context; undefined when it records nothing. */
export function traceHeaders(span: Span): Record<string, string> | undefined {
  if (active === null || !span.isRecording()) return undefined;
  const carrier: Record<string, string> = {};
  propagator.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier;
}

/** The `traceparent` value naming `span` as the remote parent; undefined when it records nothing. */
export function traceparentOf(span: Span): string | undefined {
  return traceHeaders(span)?.[TRACEPARENT];
}

/** The remote parent named by incoming HTTP headers or gRPC metadata (the root when none, or off). */
export function extractHeaders(headers: Headers): Context {
  if (active === null) return ROOT_CONTEXT;
  return propagator.extract(ROOT_CONTEXT, headers, headersGetter);
}

/** Ends `span`, marking it failed with `error` when given (a message or an exception). */
export function endSpan(span: Span, error?: unknown): void {
  if (active !== null && error !== undefined && error !== null) {
    const message = error instanceof Error ? error.message : String(error);
    if (error instanceof Error) span.recordException(error);
    span.setStatus({ code: SpanStatusCode.ERROR, message });
  }
  span.end();
}
