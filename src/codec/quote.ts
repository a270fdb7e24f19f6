/** The longest text an error message quotes from a file or a request; the rest is counted, not shown. */
export const QUOTE_MAX = 80;

// What JSON.stringify leaves as it is and a terminal or a log viewer would act on: DEL and the C1
// controls (0x9b is an 8-bit CSI, an ANSI escape on its own), format characters (bidi overrides
// that reorder the message around them), and the line and paragraph separators.
const UNSAFE = /[\u007f-\u009f\p{Cf}\u2028\u2029]/gu;

/**
 * A value read from a file or a request, as every error message quotes it: JSON-quoted with
 * every control and format character escaped (\u001b, never an escape a terminal obeys), and cut
 * to `max` characters, saying how long it was. A 200 KB GGUF key or a 4 MB JSON field gives a
 * message of about a hundred characters. Objects and arrays are quoted as their JSON text.
 */
export function quote(v: unknown, max = QUOTE_MAX): string {
  if (typeof v === "string") return cut(v, max, (s) => JSON.stringify(s));
  if (typeof v === "number" || typeof v === "boolean" || typeof v === "bigint" || v === null || v === undefined) return String(v);
  let text: string;
  try {
    text = JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x)) ?? String(v);
  } catch {
    text = Object.prototype.toString.call(v);
  }
  return cut(text, max, (s) => s);
}

function cut(s: string, max: number, show: (s: string) => string): string {
  const head = s.length > max ? show(s.slice(0, max)) : show(s);
  const safe = head.replace(UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return s.length > max ? `${safe}… (${s.length} characters)` : safe;
}
