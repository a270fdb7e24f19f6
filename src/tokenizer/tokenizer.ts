import assert from "node:assert";

export interface EncodeOptions {
  /** Prepend the BOS id. Default: the tokenizer's `addBos`. */
  bos?: boolean;
  /** Append the EOS id. Default false. */
  eos?: boolean;
}

/** Text <-> token ids. Decoding works on bytes so that streams can cut between tokens anywhere. */
export interface Tokenizer {
  readonly vocabSize: number;
  /** The BOS id, or -1 for a vocabulary without one (Qwen2). */
  readonly bos: number;
  /** The main end-of-sequence id (what `encode(..., { eos: true })` appends). */
  readonly eos: number;
  /** Every id that ends generation (Llama 3 has several: <|end_of_text|>, <|eom_id|>, <|eot_id|>); holds `eos`. */
  readonly eosIds: readonly number[];
  /** Whether a prompt starts with BOS unless told otherwise (tokenizer_config's add_bos_token). */
  readonly addBos: boolean;
  /** The text of the BOS and EOS tokens, as chat templates spell them (`bos_token`, `eos_token`). */
  readonly bosToken?: string;
  readonly eosToken?: string;
  encode(text: string, opts?: EncodeOptions): number[];
  /** UTF-8 of all the pieces (invalid sequences become U+FFFD); BOS and EOS give nothing. */
  decode(ids: readonly number[]): string;
  /**
   * The raw bytes token `id` contributes when it follows `prev` (the previous id, or -1 at the
   * start). A piece may hold part of a UTF-8 character; StreamDecoder stitches them.
   */
  pieceBytes(id: number, prev?: number): Uint8Array;
  /** One token's text on its own: lossy for partial characters; streams should use StreamDecoder. */
  decodeToken(id: number, prev?: number): string;
}

/**
 * Incremental detokenizer for streaming: push ids one at a time, get back only complete
 * characters. Bytes of a character split across tokens are held until it completes.
 */
export class StreamDecoder {
  private readonly utf8 = new TextDecoder("utf-8");
  private prev: number;

  /** `prev` is the id before the first one pushed (e.g. the prompt's last), -1 for none. */
  constructor(
    private readonly tokenizer: Tokenizer,
    prev = -1,
  ) {
    this.prev = prev;
  }

  /** The text that became complete with this token (possibly ""). */
  push(id: number): string {
    const bytes = this.tokenizer.pieceBytes(id, this.prev);
    this.prev = id;
    return this.utf8.decode(bytes, { stream: true });
  }

  /** Whatever is still held (an incomplete character becomes U+FFFD); the decoder can be reused. */
  flush(): string {
    this.prev = -1;
    return this.utf8.decode();
  }
}

const EMPTY = new Uint8Array(0);
const BYTE_PIECES: Uint8Array[] = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));

/**
 * ids 0..255 are the bytes of the UTF-8 text, 256 is BOS, 257 is EOS; vocabSize 258 (no padding:
 * the classifier's row count is all it costs, and nothing assumes a round number).
 */
export class ByteTokenizer implements Tokenizer {
  readonly vocabSize = 258;
  readonly bos = 256;
  readonly eos = 257;
  readonly eosIds = [257];
  readonly addBos = true;
  private readonly utf8 = new TextEncoder();

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const bytes = this.utf8.encode(text);
    const ids: number[] = [];
    if (opts.bos ?? true) ids.push(this.bos);
    for (let i = 0; i < bytes.length; i++) ids.push(bytes[i]!);
    if (opts.eos) ids.push(this.eos);
    return ids;
  }

  decode(ids: readonly number[]): string {
    const bytes: number[] = [];
    for (const id of ids) {
      this.check(id);
      if (id < 256) bytes.push(id);
    }
    return new TextDecoder("utf-8").decode(Uint8Array.from(bytes));
  }

  pieceBytes(id: number, _prev = -1): Uint8Array {
    this.check(id);
    return id < 256 ? BYTE_PIECES[id]! : EMPTY;
  }

  decodeToken(id: number, prev = -1): string {
    return new TextDecoder("utf-8").decode(this.pieceBytes(id, prev));
  }

  private check(id: number): void {
    assert(Number.isInteger(id) && id >= 0 && id < this.vocabSize, `token ${id} outside byte vocab 0..${this.vocabSize - 1}`);
  }
}
