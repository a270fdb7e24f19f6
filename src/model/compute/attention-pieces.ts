/**
 * KV heads per piece of a decoding sequence's attention dispatch. A decoding sequence streams its
 * blocks once for all the heads of a piece (kernels/assembly/attention.ts, attendStream), so
 * pieces want to be few and wide; the threads share the `seqs` sequences' pieces, so they want
 * to be enough to go round evenly. This picks the widest piece that keeps the busiest thread's
 * heads (its pieces, rounded up, times their width) at the least: 3 of 6 heads each on 2
 * threads, 2 on 3, the whole sequence once the batch fills the threads.
 */
export function decodeHeadsPerPiece(nKv: number, seqs: number, threads: number): number {
  let best = nKv;
  let bestHeads = Number.POSITIVE_INFINITY;
  for (let per = nKv; per >= 1; per--) {
    const heads = Math.ceil((seqs * Math.ceil(nKv / per)) / threads) * per;
    if (heads < bestHeads) {
      best = per;
      bestHeads = heads;
    }
  }
  return best;
}
