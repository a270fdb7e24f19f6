import type { ChatMessage } from "../tokenizer/index.ts";
import { HttpError } from "./errors.ts";
import { quote } from "../codec/index.ts";

export type ChatRole = "system" | "developer" | "user" | "assistant" | "tool";

/** A tool call an assistant made earlier in the conversation (history only: this engine does not call tools). */
export interface ChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

const ROLES: readonly ChatRole[] = ["system", "developer", "user", "assistant", "tool"];
const MAX_MESSAGES = 4096;

function bad(message: string): HttpError {
  return new HttpError(400, message, "invalid_request_error", "messages");
}

function text(v: unknown, where: string): string {
  if (typeof v === "string") return v;
  if (Array.isArray(v)) {
    return v
      .map((p, j) => {
        const part = p as Record<string, unknown>;
        if ((part?.type === "text" && typeof part.text === "string") || (part?.type === "refusal" && typeof part.refusal === "string")) {
          return (part.text ?? part.refusal) as string;
        }
        throw bad(`${where}.content[${j}]: only text parts are supported, got type ${quote(part?.type)}`);
      })
      .join("");
  }
  throw bad(`${where}.content must be a string or an array of text parts`);
}

function optString(m: Record<string, unknown>, key: string, where: string): string | undefined {
  const v = m[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw bad(`${where}.${key} must be a string`);
  return v;
}

function toolCalls(v: unknown, where: string): ChatToolCall[] {
  if (!Array.isArray(v)) throw bad(`${where}.tool_calls must be an array on an assistant message`);
  return v.map((c, j) => {
    const call = c as Record<string, unknown>;
    const fn = call?.function as Record<string, unknown> | undefined;
    const at = `${where}.tool_calls[${j}]`;
    if (typeof call?.id !== "string") throw bad(`${at}.id must be a string`);
    if (call.type !== undefined && call.type !== "function") throw bad(`${at}.type must be "function"`);
    if (typeof fn?.name !== "string" || typeof fn.arguments !== "string") throw bad(`${at}.function needs a string name and string arguments`);
    return { id: call.id, type: "function", function: { name: fn.name, arguments: fn.arguments } };
  });
}

/**
 * Checks `messages` as OpenAI does and hands them on as the chat template sees them
 * (OpenAI's field names): an assistant message may have `content: null` when it carries
 * `tool_calls`; a `tool` message answers a `tool_call_id`.
 */
export function parseMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw bad("messages must be a non-empty array");
  if (v.length > MAX_MESSAGES) throw bad(`messages has ${v.length} entries; at most ${MAX_MESSAGES}`);
  return v.map((raw, i): ChatMessage => {
    const where = `messages[${i}]`;
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw bad(`${where} must be an object`);
    const m = raw as Record<string, unknown>;
    const role = m.role as ChatRole;
    if (!ROLES.includes(role)) throw bad(`${where}.role ${quote(m.role)} is not one of ${ROLES.join(", ")}`);
    const name = optString(m, "name", where);
    const named = name === undefined ? {} : { name };
    const hasCalls = m.tool_calls !== undefined && m.tool_calls !== null;
    if (hasCalls && role !== "assistant") throw bad(`${where}.tool_calls must be an array on an assistant message`);
    if (hasCalls) {
      const content = m.content === null || m.content === undefined ? null : text(m.content, where);
      return { role, content, ...named, tool_calls: toolCalls(m.tool_calls, where) };
    }
    if (m.content === null || m.content === undefined)
      throw bad(`${where}.content is required${role === "assistant" ? " unless the message has tool_calls" : ""}`);
    const content = text(m.content, where);
    if (role === "tool") {
      const toolCallId = optString(m, "tool_call_id", where);
      if (toolCallId === undefined) throw bad(`${where}.tool_call_id is required for a tool message`);
      return { role, content, tool_call_id: toolCallId };
    }
    return { role, content, ...named };
  });
}
