export { log } from "./log.ts";
export { createMetrics, metricsResponse, recordEngineState, recordFinished, recordServed, type Metrics, type MetricsRole } from "./metrics.ts";
export {
  endSpan,
  extractHeaders,
  setupTracing,
  shutdownTracing,
  SpanKind,
  startSpan,
  startTracing,
  traceHeaders,
  traceparentOf,
  tracingEnabled,
  tracingEndpoint,
  type Attributes,
  type Context,
  type Span,
} from "./tracing.ts";
