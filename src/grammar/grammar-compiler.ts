import { type CompiledGrammar, GrammarCompiler as XgCompiler, GrammarMatcher, TokenizerInfo } from "@mlc-ai/web-xgrammar";
import { checkConstraint, ConstraintError, type ConstraintSpec, constraintHash, escapeControls, parseChoices } from "./constraint.ts";
import { TokenMatcher } from "./token-matcher.ts";
import { type XgrammarRuntime, xgrammarRuntime } from "./xgrammar-runtime.ts";

/** A constraint compiled against one vocabulary, shared by every sequence that uses it. */
export interface CompiledConstraint {
  readonly spec: ConstraintSpec;
  readonly hash: string;
  readonly grammar: CompiledGrammar;
}

/**
 * The vocabulary as xgrammar reads it: each token's bytes in GPT-2's byte-level alphabet
 * (whatever the tokenizer's own scheme, so partial UTF-8 pieces survive), "" for a token that
 * produces no text (BOS, EOS, other specials: never allowed, except stop tokens at the end).
 */
export interface GrammarVocab {
  encoded: readonly string[];
  /** Tokens that end a sequence: allowed where the grammar may end. */
  stopIds: readonly number[];
}

/** Compiled grammars kept per compiler (least recently used evicted): compile time is paid once per schema. */
const GRAMMAR_CACHE_ENTRIES = 64;

/**
 * Compiles constraints against one tokenizer's vocabulary, each once (bounded cache keyed by
 * constraintHash), and makes matchers for sequences. A constraint that does not compile is a
 * ConstraintError carrying xgrammar's reason.
 */
export class ConstraintCompiler {
  private readonly cache = new Map<string, Promise<CompiledConstraint>>();

  private constructor(
    private readonly runtime: XgrammarRuntime,
    private readonly compiler: XgCompiler,
    readonly vocab: GrammarVocab,
  ) {}

  get vocabSize(): number {
    return this.vocab.encoded.length;
  }

  static async create(vocab: GrammarVocab): Promise<ConstraintCompiler> {
    const runtime = await xgrammarRuntime();
    const info = await TokenizerInfo.createTokenizerInfo([...vocab.encoded], "byte_level", false, vocab.encoded.length, [...vocab.stopIds]);
    const compiler = await XgCompiler.createGrammarCompiler(info, false);
    return new ConstraintCompiler(runtime, compiler, vocab);
  }

  /** The compiled constraint (from the cache when it was compiled before), or ConstraintError. */
  compile(spec: ConstraintSpec): Promise<CompiledConstraint> {
    checkConstraint(spec);
    const hash = constraintHash(spec);
    const hit = this.cache.get(hash);
    if (hit) {
      this.cache.delete(hash);
      this.cache.set(hash, hit);
      return hit;
    }
    const p = this.build(spec, hash);
    this.cache.set(hash, p);
    // A failure is not kept: the next request gets its own error (and nothing holds the slot).
    p.catch(() => this.cache.delete(hash));
    while (this.cache.size > GRAMMAR_CACHE_ENTRIES) {
      const oldest = this.cache.keys().next().value as string;
      const old = this.cache.get(oldest)!;
      this.cache.delete(oldest);
      old.then(
        (c) => c.grammar.dispose(),
        () => {},
      );
    }
    return p;
  }

  /** A fresh matcher at the start of `c`'s grammar, for one sequence (which disposes it). */
  async matcher(c: CompiledConstraint): Promise<TokenMatcher> {
    const m = await GrammarMatcher.createGrammarMatcher(c.grammar);
    return new TokenMatcher(m, this.runtime, this.vocabSize, c.spec, this.vocab);
  }

  private async build(spec: ConstraintSpec, hash: string): Promise<CompiledConstraint> {
    const comp = this.compiler;
    const { value, error, errors } = await this.runtime.capture(async () => {
      switch (spec.kind) {
        case "json_schema":
          return comp.compileJSONSchema(spec.source, false, -1, [", ", ": "], true);
        case "json_object":
          return comp.compileJSONSchema('{"type": "object"}', false, -1, [", ", ": "], false);
        case "regex":
          return comp.compileStructuralTag({ type: "structural_tag", format: { type: "regex", pattern: spec.source } });
        case "choice":
          return comp.compileStructuralTag({
            type: "structural_tag",
            format: { type: "or", elements: parseChoices(spec.source)!.map((value) => ({ type: "const_string", value })) },
          });
        case "grammar":
          return comp.compileGrammar(spec.source, "root");
      }
    });
    if (value === undefined) throw new ConstraintError(`the ${spec.kind} does not compile: ${reason(errors, error)}`);
    return { spec, hash, grammar: value };
  }
}

/** xgrammar's own words, without its source file names: "[FATAL] file.cc:552: EBNF parser error ..." → "EBNF parser error ...". */
function reason(errors: string[], error: unknown): string {
  const line = errors.find((e) => e.includes("[FATAL]")) ?? errors[0];
  const text = line
    ? line.replace(/^.*?\[FATAL\]\s*\S+:\d+:\s*/, "").replace(/^Check failed:.*?: /, "")
    : error instanceof Error
      ? error.message
      : String(error);
  // It may quote the request's grammar: no control or format character reaches a client or a log.
  return escapeControls(text.split("\n")[0]!.slice(0, 300));
}

const compilers = new WeakMap<object, Promise<ConstraintCompiler>>();

/**
 * The process's compiler for one tokenizer (`key`), made on first use: every door of an engine
 * (HTTP, EngineControl.Prefill) shares its cache. A failure to make it is not kept.
 */
export function compilerFor(key: object, vocab: () => GrammarVocab): Promise<ConstraintCompiler> {
  let c = compilers.get(key);
  if (!c) {
    c = ConstraintCompiler.create(vocab());
    compilers.set(key, c);
    c.catch(() => compilers.delete(key));
  }
  return c;
}
