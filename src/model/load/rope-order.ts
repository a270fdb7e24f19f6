/**
 * RoPE pairs dimensions of each head. The transformer (like llama2.c and Meta's checkpoints)
 * rotates interleaved pairs (2i, 2i+1); Hugging Face Llama/Qwen2 weights and GGUF's NEOX-rope
 * architectures rotate split halves (i, i + headDim/2). Reordering the output rows of wq and wk
 * (and the q/k biases) turns one into the other without changing the attention scores, since a
 * head's q and k are permuted alike. These two functions are the only place that order lives.
 *
 * `m` holds nHeads * headDim rows of `cols` values (cols = 1 for a bias vector).
 */
export function splitHalfToInterleaved(m: Float32Array, nHeads: number, headDim: number, cols: number): Float32Array {
  return permuteRows(m, nHeads, headDim, cols, true);
}

/** The inverse of splitHalfToInterleaved: what Hugging Face's converter does to Meta weights. */
export function interleavedToSplitHalf(m: Float32Array, nHeads: number, headDim: number, cols: number): Float32Array {
  return permuteRows(m, nHeads, headDim, cols, false);
}

/**
 * splitHalfToInterleaved on a packed matrix's bytes: rows of `rowBytes` bytes (whole q8_0
 * blocks), moved as they are, so the packed values never pass through f32.
 */
export function splitHalfToInterleavedBytes(m: Uint8Array, nHeads: number, headDim: number, rowBytes: number): Uint8Array {
  return permuteRows(m, nHeads, headDim, rowBytes, true);
}

function permuteRows<T extends Float32Array | Uint8Array>(m: T, nHeads: number, headDim: number, cols: number, toInterleaved: boolean): T {
  if (m.length !== nHeads * headDim * cols) throw new Error(`rope reorder: ${m.length} values, want ${nHeads} heads x ${headDim} x ${cols}`);
  const half = headDim / 2;
  const out = (m instanceof Float32Array ? new Float32Array(m.length) : new Uint8Array(m.length)) as T;
  for (let h = 0; h < nHeads; h++) {
    for (let i = 0; i < half; i++) {
      for (let p = 0; p < 2; p++) {
        const inter = h * headDim + 2 * i + p;
        const split = h * headDim + p * half + i;
        const [to, from] = toInterleaved ? [inter, split] : [split, inter];
        out.set(m.subarray(from * cols, (from + 1) * cols) as never, to * cols);
      }
    }
  }
  return out;
}
