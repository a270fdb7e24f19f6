import { readFileSync } from "node:fs";
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import type { Tokenizer } from "./tokenizer.ts";

/** One OpenAI chat message as a template sees it: content may be null beside tool_calls; tool messages carry tool_call_id. */
export interface ChatMessage {
  role: string;
  content: string | null;
  [field: string]: unknown;
}

export interface RenderOptions {
  /** Open the assistant's turn at the end. Default true (a chat completion always asks for one). */
  addGenerationPrompt?: boolean;
  /** The request's `tools` (OpenAI function specs), handed to templates that take them. */
  tools?: readonly unknown[];
  /** The clock `strftime_now` reads (tests fix it). */
  now?: () => Date;
}

/**
 * The template for models that ship none (the embedded model, llama2.c checkpoints): each turn
 * is `<|role|>`, a newline, the content and a newline; the assistant's turn is opened last.
 */
export const DEFAULT_CHAT_TEMPLATE =
  "{%- for message in messages -%}{{ '<|' + message['role'] + '|>\\n' + (message['content'] or '') + '\\n' }}{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}";

/**
 * A model's chat template (Jinja, as in tokenizer_config.json's chat_template or GGUF's
 * tokenizer.chat_template) rendered with @huggingface/jinja, given what transformers gives it:
 * messages, add_generation_prompt, bos_token, eos_token, tools, raise_exception, strftime_now.
 */
export class ChatTemplate {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly tokens: { bosToken?: string; eosToken?: string },
    /** Where the template came from, for error messages. */
    private readonly origin = "chat template",
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new Error(`${origin} does not parse: ${(e as Error).message}`);
    }
  }

  /** The prompt text; a template's raise_exception or a render error becomes an Error naming the template. */
  render(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    // Template.render declares the library's strftime_now (whose month names follow the machine's
    // locale) and refuses a second one, so the globals are declared here, with an English strftime.
    const now = opts.now ?? (() => new Date());
    const vars: Record<string, unknown> = {
      true: true,
      false: false,
      none: null,
      True: true,
      False: false,
      None: null,
      raise_exception: (message: unknown) => {
        throw new ChatTemplateError(`${this.origin} refused the conversation: ${String(message)}`);
      },
      range: pyRange,
      strftime_now: (format: string) => strftime(now(), format),
      messages: messages.map(forTemplate),
      add_generation_prompt: opts.addGenerationPrompt ?? true,
      bos_token: this.tokens.bosToken ?? "",
      eos_token: this.tokens.eosToken ?? "",
    };
    if (opts.tools && opts.tools.length > 0) vars.tools = opts.tools;
    const env = new Environment();
    for (const [k, v] of Object.entries(vars)) env.set(k, v);
    try {
      const out = new Interpreter(env).run(this.template.parsed).value;
      if (typeof out !== "string") throw new Error(`rendered a ${typeof out}, not text`);
      return out;
    } catch (e) {
      if (e instanceof ChatTemplateError) throw e;
      throw new ChatTemplateError(`${this.origin} failed to render: ${(e as Error).message}`);
    }
  }
}

/**
 * OpenAI sends tool-call arguments as a JSON string; templates (Llama 3's `arguments | tojson`,
 * Qwen's) expect the object, so a string that parses is handed over parsed, as vLLM does.
 */
function forTemplate(m: ChatMessage): ChatMessage {
  const calls = m.tool_calls;
  if (!Array.isArray(calls)) return m;
  return {
    ...m,
    tool_calls: calls.map((c: { function?: { arguments?: unknown } }) => {
      const args = c?.function?.arguments;
      if (typeof args !== "string") return c;
      try {
        return { ...c, function: { ...c.function, arguments: JSON.parse(args) } };
      } catch {
        return c;
      }
    }),
  };
}

function pyRange(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error("range() step must not be zero");
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

/** The template refused the conversation (raise_exception) or could not render it: the request's fault. */
export class ChatTemplateError extends Error {}

/** What turns a chat request into prompt ids: the model's template and tokenizer together. */
export interface ChatRenderer {
  promptTokens(messages: readonly ChatMessage[], tools?: readonly unknown[]): number[];
  /** The template's text (what a tool-call parser is told from). */
  readonly templateSource?: string;
}

/**
 * `template` null: DEFAULT_CHAT_TEMPLATE. BOS is added as for any prompt, unless the template
 * already wrote the BOS token's text (Llama 3's does): its text encodes to the BOS id, so the
 * rendered prompt is encoded without BOS and BOS is put first only if it is not there already.
 */
export function chatRenderer(tokenizer: Tokenizer, template: string | null, origin?: string): ChatRenderer {
  const t = new ChatTemplate(template ?? DEFAULT_CHAT_TEMPLATE, tokenizer, origin);
  return {
    templateSource: template ?? DEFAULT_CHAT_TEMPLATE,
    promptTokens(messages, tools) {
      const ids = tokenizer.encode(t.render(messages, tools ? { tools } : {}), { bos: false });
      if (tokenizer.addBos && tokenizer.bos >= 0 && ids[0] !== tokenizer.bos) ids.unshift(tokenizer.bos);
      return ids;
    },
  };
}

/**
 * The renderer a served model uses: the template in `overrideFile` (--chat-template) if given,
 * else the model's own, else DEFAULT_CHAT_TEMPLATE. A file that cannot be read or parsed is
 * refused here, at start-up, naming it.
 */
export function chatRendererFor(tokenizer: Tokenizer, modelTemplate: string | null, overrideFile?: string): ChatRenderer {
  if (!overrideFile) return chatRenderer(tokenizer, modelTemplate, modelTemplate === null ? "default chat template" : "the model's chat template");
  let text: string;
  try {
    text = readFileSync(overrideFile, "utf8");
  } catch (e) {
    throw new Error(`chat template ${overrideFile} cannot be read: ${(e as Error).message}`);
  }
  return chatRenderer(tokenizer, text, `chat template ${overrideFile}`);
}

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/** The strftime directives chat templates use (%d %b %Y, %B, %A, %H:%M...), in English as Python's C locale; others pass through. */
export function strftime(d: Date, format: string): string {
  const pad = (n: number) => String(n).padStart(2, "0");
  return format.replace(/%([a-zA-Z%])/g, (all, c: string) => {
    switch (c) {
      case "d":
        return pad(d.getDate());
      case "m":
        return pad(d.getMonth() + 1);
      case "Y":
        return String(d.getFullYear());
      case "y":
        return pad(d.getFullYear() % 100);
      case "b":
        return MONTHS[d.getMonth()]!.slice(0, 3);
      case "B":
        return MONTHS[d.getMonth()]!;
      case "a":
        return DAYS[d.getDay()]!.slice(0, 3);
      case "A":
        return DAYS[d.getDay()]!;
      case "H":
        return pad(d.getHours());
      case "M":
        return pad(d.getMinutes());
      case "S":
        return pad(d.getSeconds());
      case "%":
        return "%";
      default:
        return all;
    }
  });
}
