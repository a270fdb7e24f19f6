import { GrammarCompiler, TokenizerInfo } from "@mlc-ai/web-xgrammar";

/**
 * The one xgrammar WebAssembly instance of this thread, and the two things its JS wrapper
 * keeps to itself that serving needs:
 *
 * - Its error text. A grammar xgrammar cannot parse makes it print "[FATAL] file:line: why"
 *   through the `printErr` it bound at start-up and abort the call; the caller gets an opaque
 *   "Aborted()". Start-up runs with console.error routed through `printErr` below, so while
 *   `capture` runs, those lines are collected (and kept off the log) to become the 400's text.
 * - Its memory. The wrapper's next-token bitmask is async and copies; the embind call under it
 *   is synchronous but returns a std::vector whose elements cost a call each (a call per 32
 *   tokens of the vocabulary, every token). Start-up captures the instance's exports, so TokenMatcher reads the vector's
 *   words straight from linear memory (wasm32 libc++: begin, end, capacity pointers).
 */
export interface XgrammarRuntime {
  /** The instance's linear memory (re-read .buffer after any call: the memory may grow). */
  memory: WebAssembly.Memory;
  /** Runs `fn` (sync or async) collecting xgrammar's error lines; they are in `errors` after. */
  capture<T>(fn: () => Promise<T>): Promise<{ value?: T; error?: unknown; errors: string[] }>;
}

let runtime: Promise<XgrammarRuntime> | null = null;
let collecting: string[] | null = null;
/** Serializes captures: each attributes error lines to its own call. */
let chain: Promise<unknown> = Promise.resolve();

export function xgrammarRuntime(): Promise<XgrammarRuntime> {
  runtime ??= start();
  return runtime;
}

async function start(): Promise<XgrammarRuntime> {
  const origError = console.error;
  const origInstantiate = WebAssembly.instantiate;
  let memory: WebAssembly.Memory | null = null;
  const printErr = (...args: unknown[]): void => {
    if (collecting !== null) collecting.push(args.map(String).join(" "));
    else origError.apply(console, args);
  };
  const grab = (exports: Record<string, unknown>): void => {
    for (const v of Object.values(exports)) if (v instanceof WebAssembly.Memory) memory = v;
  };
  console.error = printErr;
  (WebAssembly as { instantiate: unknown }).instantiate = async (...args: unknown[]) => {
    const out = await (origInstantiate as (...a: unknown[]) => Promise<WebAssembly.WebAssemblyInstantiatedSource | WebAssembly.Instance>)(...args);
    grab(("instance" in out ? out.instance.exports : out.exports) as Record<string, unknown>);
    return out;
  };
  try {
    // The first call starts the instance (with the hooks above in place).
    const info = await TokenizerInfo.createTokenizerInfo([""], "raw", false, 1, [0]);
    const comp = await GrammarCompiler.createGrammarCompiler(info, false);
    comp.dispose();
    info.dispose();
  } finally {
    console.error = origError;
    (WebAssembly as { instantiate: unknown }).instantiate = origInstantiate;
  }
  if (memory === null) throw new Error("xgrammar: its WebAssembly memory was not found");
  const mem: WebAssembly.Memory = memory;
  return {
    memory: mem,
    capture<T>(fn: () => Promise<T>) {
      const run = chain.then(async () => {
        const errors: string[] = [];
        collecting = errors;
        try {
          return { value: await fn(), errors };
        } catch (error) {
          return { error, errors };
        } finally {
          collecting = null;
        }
      });
      chain = run;
      return run;
    },
  };
}
