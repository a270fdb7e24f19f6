import { log } from "../obs/index.ts";

/** An error with the HTTP status and OpenAI error type it is reported with. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = status >= 500 ? "server_error" : "invalid_request_error",
    readonly param: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

/**
 * OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`. Anything but an
 * HttpError is a bug or a fault below the adapters: its text (a JS TypeError, an address)
 * goes to the log, never to the client.
 */
export function errorResponse(e: unknown): Response {
  if (!(e instanceof HttpError)) log.error("internal error answering a request", { error: e instanceof Error ? e.message : String(e) });
  const err = e instanceof HttpError ? e : new HttpError(500, "internal error (see the server's log)");
  return Response.json({ error: { message: err.message, type: err.type, param: err.param, code: err.status } }, { status: err.status, headers: err.headers });
}
