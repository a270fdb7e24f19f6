/**
 * GPT-2's byte-level alphabet: every byte stands for one printable code point, so a byte-level
 * BPE vocabulary is plain strings. Printable Latin-1 bytes stand for themselves; the other 68
 * (controls, space, NBSP, soft hyphen...) are moved to U+0100 onwards in byte order.
 */
export const BYTE_TO_CHAR: readonly string[] = buildByteToChar();

/** The inverse of BYTE_TO_CHAR: code point → byte, -1 for code points outside the alphabet. */
const CHAR_TO_BYTE: Int16Array = (() => {
  const out = new Int16Array(256 + 68).fill(-1);
  BYTE_TO_CHAR.forEach((c, b) => (out[c.codePointAt(0)!] = b));
  return out;
})();

function buildByteToChar(): string[] {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const out: string[] = [];
  let moved = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCodePoint(printable(b) ? b : 256 + moved++);
  return out;
}

/** The bytes a byte-level token string stands for, or null if it holds a code point outside the alphabet. */
export function byteLevelBytes(token: string): Uint8Array | null {
  const out = new Uint8Array(token.length);
  for (let i = 0; i < token.length; i++) {
    const b = CHAR_TO_BYTE[token.charCodeAt(i)] ?? -1;
    if (b < 0) return null;
    out[i] = b;
  }
  return out;
}
