export { choiceSeed, LIMITS, parseCompletion, randomSeed, samplingOf, type CompletionParams } from "./completion-request.ts";
export type { CompletionKind } from "./openai-params.ts";
export { parseMessages, type ChatRole, type ChatToolCall } from "./chat-messages.ts";
export { completionResponse, TextAssembler, type ResponseContext } from "./completion-response.ts";
export {
  engineHttpHandler,
  requestId,
  clientRequestId,
  HANDLE_HEADER,
  FIRST_TOKEN_HEADER,
  DRAWS_HEADER,
  CHOICES_HEADER,
  CONSTRAINT_HEADER,
  compileFor,
  matchersFor,
  type EngineHttpContext,
  type RequestEnd,
} from "./engine-http.ts";
export { HttpError, errorResponse } from "./errors.ts";
export { serveHttp, type HttpListenerOptions, type HttpServer, type ServeHttpOptions } from "./serve-http.ts";
export { TokenQueue, type StreamEnd, type EndReason } from "./token-queue.ts";
export { sseData } from "./sse-data.ts";
export { apiKeysFrom, frontDoor, type FrontDoorOptions } from "./front-door.ts";
export { fromWire, toWire, LogprobsWriter, type WireLogprobs } from "./logprobs-shape.ts";
export { checkSpec, parseStructuredOutput, structuredOutputsField, STRUCTURED_FIELDS } from "./structured-output.ts";
export { parseToolCalls, parseTools, TOOL_PARSERS, toolConstraint, type ToolParserName, type ToolPlan } from "./tool-calls.ts";
export { detokenizeRoute, tokenizeRoute, type TokenizeContext } from "./tokenize.ts";
