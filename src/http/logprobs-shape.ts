import type { Tokenizer } from "../tokenizer/index.ts";
import type { TokenLogprobs } from "../rng/index.ts";
import type { CompletionKind } from "./openai-params.ts";

/** vLLM's floor for a masked token's logprob: JSON has no -Infinity. */
const FLOOR = -9999;

const clamp = (lp: number) => (lp < FLOOR ? FLOOR : lp);

/** The internal hop's form (token ids, exact): what a decode engine tells the gateway per token. */
export type WireLogprobs = [number, [number, number][]];

export function toWire(lp: TokenLogprobs): WireLogprobs {
  return [lp.logprob, lp.top];
}

export function fromWire(v: unknown): TokenLogprobs | undefined {
  if (!Array.isArray(v) || typeof v[0] !== "number" || !Array.isArray(v[1])) return undefined;
  const top = (v[1] as unknown[]).filter((e): e is [number, number] => Array.isArray(e) && typeof e[0] === "number" && typeof e[1] === "number");
  return { logprob: v[0], top };
}

/**
 * One choice's logprobs in OpenAI's shapes, built token by token; `take` returns what
 * was added since the last take (a stream chunk's share, or the whole choice once).
 * chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null};
 * completions: {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}.
 */
export class LogprobsWriter {
  private prev: number;
  private offset: number;
  private content: unknown[] = [];
  private tokens: string[] = [];
  private tokenLogprobs: number[] = [];
  private tops: Record<string, number>[] = [];
  private offsets: number[] = [];

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly kind: CompletionKind,
    prevToken: number,
    /** Completions: where the generated text starts in the choice's text (after an echoed prompt). */
    textOffset: number,
  ) {
    this.prev = prevToken;
    this.offset = textOffset;
  }

  add(token: number, lp: TokenLogprobs): void {
    const piece = (id: number) => this.tokenizer.decodeToken(id, this.prev);
    const text = piece(token);
    if (this.kind === "chat") {
      const entry = (id: number, logprob: number, s: string) => ({ token: s, logprob: clamp(logprob), bytes: [...this.tokenizer.pieceBytes(id, this.prev)] });
      this.content.push({ ...entry(token, lp.logprob, text), top_logprobs: lp.top.map(([id, l]) => entry(id, l, piece(id))) });
    } else {
      this.tokens.push(text);
      this.tokenLogprobs.push(clamp(lp.logprob));
      const top: Record<string, number> = {};
      for (const [id, l] of lp.top) top[piece(id)] ??= clamp(l);
      // As vLLM: the sampled token is always among the alternatives (up to logprobs + 1 entries).
      top[text] ??= clamp(lp.logprob);
      this.tops.push(top);
      this.offsets.push(this.offset);
      this.offset += text.length;
    }
    this.prev = token;
  }

  take(): Record<string, unknown> {
    if (this.kind === "chat") {
      const out = { content: this.content, refusal: null };
      this.content = [];
      return out;
    }
    const out = { tokens: this.tokens, token_logprobs: this.tokenLogprobs, top_logprobs: this.tops, text_offset: this.offsets };
    this.tokens = [];
    this.tokenLogprobs = [];
    this.tops = [];
    this.offsets = [];
    return out;
  }
}
