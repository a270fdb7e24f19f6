import type { GrammarMatcher } from "@mlc-ai/web-xgrammar";
import type { ConstraintSpec } from "./constraint.ts";
import type { XgrammarRuntime } from "./xgrammar-runtime.ts";

interface EmbindVector {
  $$: { ptr: number };
  size(): number;
  get(i: number): number;
  delete(): void;
}
interface MatcherHandle {
  GetNextTokenBitmask(vocab: number): EmbindVector;
  AcceptToken(token: number, verbose: boolean): boolean;
  IsTerminated(): boolean;
}

/**
 * One sequence's place in its grammar: which tokens may come next (a bitmask, bit i of word
 * i >> 5 set when token i is allowed), and the token that came. Stop tokens are allowed
 * exactly when the grammar may end here; once one is accepted the matcher is terminated.
 * Owned by one sequence and disposed with it (its state lives in WebAssembly memory).
 */
export class TokenMatcher {
  /** Words of a mask: ceil(vocab / 32). */
  readonly words: number;
  private readonly handle: MatcherHandle;
  private heap: Int32Array;
  private disposed = false;

  constructor(
    private readonly matcher: GrammarMatcher,
    private readonly runtime: XgrammarRuntime,
    readonly vocabSize: number,
    /** What it matches, and the vocabulary it was compiled against: enough for another thread to build its twin. */
    readonly spec: ConstraintSpec,
    readonly vocab: { readonly encoded: readonly string[]; readonly stopIds: readonly number[] },
  ) {
    this.words = Math.ceil(vocabSize / 32);
    // The wrapper's handle is private in its types; its methods are the synchronous embind ones.
    this.handle = (matcher as unknown as { handle: MatcherHandle }).handle;
    this.heap = new Int32Array(runtime.memory.buffer);
  }

  /** Writes the next token's mask into out[0..words). */
  fillMask(out: Int32Array): void {
    const v = this.handle.GetNextTokenBitmask(this.vocabSize);
    try {
      if (this.heap.buffer !== this.runtime.memory.buffer) this.heap = new Int32Array(this.runtime.memory.buffer);
      const heap = this.heap;
      const at = (v.$$.ptr >>> 2) as number;
      const begin = heap[at]! >>> 2;
      const end = heap[at + 1]! >>> 2;
      const n = this.words;
      if (end - begin === n && v.size() === n) {
        for (let i = 0; i < n; i++) out[i] = heap[begin + i]!;
      } else {
        // Not the layout this reader knows: the slow, sure way.
        for (let i = 0; i < n; i++) out[i] = v.get(i);
      }
    } finally {
      v.delete();
    }
  }

  /** Advances past `token`; false (the state unchanged) when the grammar does not allow it. */
  accept(token: number): boolean {
    if (this.handle.IsTerminated()) return false;
    return this.handle.AcceptToken(token, false);
  }

  /** A stop token was accepted: nothing may follow. */
  get terminated(): boolean {
    return this.handle.IsTerminated();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.matcher.dispose();
  }
}
