/**
 * Cuts a byte stream that arrives in reads of any size into units (frames, gRPC
 * messages, payloads): a unit that lies whole in one read is handed over as a view into
 * it, no copy; one split across reads is gathered in a buffer reused from unit to unit.
 * Invariant: `pending` bytes of the current unit are gathered at buf[0, pending); a view
 * or the gathered unit is valid only until the next call.
 */
export class Reassembler {
  private buf: Uint8Array;
  private have = 0;
  /** Bytes of the source the last call took. */
  consumed = 0;
  /** Where head() found the unit's head: the source itself, or the gathered bytes at 0. */
  headBuf: Uint8Array = new Uint8Array(0);
  headAt = 0;

  constructor(
    initialBytes: number,
    /** growth stops doubling here (a larger unit still gets exactly its size) */
    private readonly maxBytes = Infinity,
  ) {
    this.buf = new Uint8Array(initialBytes);
  }

  /** Bytes of the current unit gathered so far. */
  get pending(): number {
    return this.have;
  }

  /**
   * The length of the unit starting at src[off] as its first `headBytes` say
   * (`lengthOf` reads them), or -1 while they are still incomplete (they are gathered).
   * Consumes nothing when the head lies whole in `src` and nothing is pending.
   */
  head(src: Uint8Array, off: number, headBytes: number, lengthOf: (b: Uint8Array, o: number) => number): number {
    if (this.have === 0 && src.length - off >= headBytes) {
      this.consumed = 0;
      this.headBuf = src;
      this.headAt = off;
      return lengthOf(src, off);
    }
    if (this.have >= headBytes) {
      this.consumed = 0;
    } else {
      this.gather(src, off, headBytes);
      if (this.have < headBytes) return -1;
    }
    this.headBuf = this.buf;
    this.headAt = 0;
    return lengthOf(this.buf, 0);
  }

  /** The unit of `need` bytes from src[off] on (after what is pending), or null when `src` ended first. */
  take(src: Uint8Array, off: number, need: number): Uint8Array | null {
    if (this.have === 0 && src.length - off >= need) {
      this.consumed = need;
      return src.subarray(off, off + need);
    }
    this.gather(src, off, need);
    if (this.have < need) return null;
    this.have = 0;
    return this.buf.subarray(0, need);
  }

  /** Forgets a unit half gathered. */
  reset(): void {
    this.have = 0;
  }

  private gather(src: Uint8Array, off: number, need: number): void {
    if (this.buf.length < need) {
      const bigger = new Uint8Array(Math.max(need, Math.min(this.maxBytes, this.buf.length * 2)));
      bigger.set(this.buf.subarray(0, this.have));
      this.buf = bigger;
    }
    const k = Math.min(need - this.have, src.length - off);
    this.buf.set(src.subarray(off, off + k), this.have);
    this.have += k;
    this.consumed = k;
  }
}
