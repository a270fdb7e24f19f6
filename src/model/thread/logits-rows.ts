/**
 * Row views of logits buffers, each made once per buffer and row, so sampling a step's rows
 * allocates nothing per token. Keyed weakly by buffer: a buffer that grows is a new key, and
 * the old one's views go with it.
 */
export class LogitsRows {
  private readonly views = new WeakMap<Float32Array, Float32Array[]>();

  constructor(readonly vocabSize: number) {}

  /** Row r of `logits` (vocabSize floats a row). */
  row(logits: Float32Array, r: number): Float32Array {
    const V = this.vocabSize;
    let views = this.views.get(logits);
    if (views === undefined) this.views.set(logits, (views = []));
    for (let i = views.length; i <= r; i++) views.push(logits.subarray(i * V, (i + 1) * V));
    return views[r]!;
  }
}
