export { log, setLogLevel } from "./log.ts";
export { createMetrics, metricsResponse, type Metrics } from "./metrics.ts";
