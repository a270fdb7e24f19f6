export { LIMITS, parseCompletion, samplingOf, type CompletionParams } from "./completion-request.ts";
export type { CompletionKind } from "./openai-params.ts";
export { completionResponse, TextAssembler } from "./completion-response.ts";
export {
  engineHttpHandler,
  requestId,
  clientRequestId,
  HANDLE_HEADER,
  FIRST_TOKEN_HEADER,
  DRAWS_HEADER,
  CHOICES_HEADER,
  CONSTRAINT_HEADER,
  type RequestEnd,
} from "./engine-http.ts";
export { HttpError, errorResponse } from "./errors.ts";
export { serveHttp, type HttpListenerOptions, type HttpServer } from "./serve-http.ts";
export { TokenQueue, type StreamEnd } from "./token-queue.ts";
export { sseData } from "./sse-data.ts";
export { fromWire } from "./logprobs-shape.ts";
export { structuredOutputsField } from "./structured-output.ts";
export { parseToolCalls, parseTools, type ToolParserName, type ToolPlan } from "./tool-calls.ts";
export { detokenizeRoute, tokenizeRoute } from "./tokenize.ts";
