export { log } from "./log.ts";
export { createMetrics, metricsResponse, type Metrics } from "./metrics.ts";
export {
  endSpan,
  extractHeaders,
  setupTracing,
  shutdownTracing,
  SpanKind,
  SpanStatusCode,
  startSpan,
  startTracing,
  traceHeaders,
  traceparentOf,
  tracingEnabled,
  tracingEndpoint,
  TRACEPARENT,
  type Attributes,
  type Context,
  type Span,
  type TracingOptions,
} from "./tracing.ts";
