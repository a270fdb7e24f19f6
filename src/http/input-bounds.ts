import { MAX_CHARS_PER_TOKEN, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_STOP_TOKEN_IDS } from "../engine/index.ts";
import { HttpError } from "./errors.ts";

/**
 * Bounds checked on a parsed request body before any tokenizing or per-element work:
 * what cannot fit the context is refused on its size alone (engine/input-limits.ts);
 * the exact check follows tokenization.
 */
function tooBig(message: string, param: string): HttpError {
  return new HttpError(400, message, "invalid_request_error", param);
}

export function checkInputBounds(kind: "completion" | "chat", body: Record<string, unknown>, maxModelLen: number): void {
  const maxChars = maxModelLen * MAX_CHARS_PER_TOKEN;
  if (kind === "chat") {
    const m = body.messages;
    if (Array.isArray(m)) {
      if (m.length > maxModelLen) throw tooBig(`messages has ${m.length} entries; more than the context of ${maxModelLen} tokens can hold`, "messages");
      let chars = 0;
      for (const msg of m) chars += contentChars((msg as Record<string, unknown> | null)?.content);
      if (chars > maxChars) throw tooBig(`messages hold ${chars} characters; more than the context of ${maxModelLen} tokens can hold`, "messages");
    }
  } else {
    const p = body.prompt;
    // One prompt (text or token ids) or a list of them: every one must fit on its own.
    const list: unknown[] = Array.isArray(p) && p.length > 0 && typeof p[0] !== "number" ? p : [p];
    if (list.length > maxModelLen) throw tooBig(`prompt lists ${list.length} prompts`, "prompt");
    for (const one of list) {
      if (typeof one === "string" && one.length > maxChars)
        throw tooBig(`prompt of ${one.length} characters is longer than the context of ${maxModelLen} tokens can hold`, "prompt");
      if (Array.isArray(one) && one.length > maxModelLen)
        throw tooBig(`prompt of ${one.length} tokens exceeds the model's context of ${maxModelLen}`, "prompt");
    }
  }
  const stop = body.stop;
  const stops = typeof stop === "string" ? [stop] : Array.isArray(stop) ? stop : [];
  if (stops.length > MAX_STOP_SEQUENCES) throw tooBig(`stop has ${stops.length} sequences; at most ${MAX_STOP_SEQUENCES}`, "stop");
  for (const s of stops) {
    if (typeof s === "string" && s.length > MAX_STOP_CHARS) throw tooBig(`a stop sequence of ${s.length} characters; at most ${MAX_STOP_CHARS}`, "stop");
  }
  const ids = body.stop_token_ids;
  if (Array.isArray(ids) && ids.length > MAX_STOP_TOKEN_IDS)
    throw tooBig(`stop_token_ids has ${ids.length} entries; at most ${MAX_STOP_TOKEN_IDS}`, "stop_token_ids");
}

function contentChars(c: unknown): number {
  if (typeof c === "string") return c.length;
  if (!Array.isArray(c)) return 0;
  let n = 0;
  for (const part of c) {
    const text = (part as Record<string, unknown> | null)?.text;
    if (typeof text === "string") n += text.length;
  }
  return n;
}
