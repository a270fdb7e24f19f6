// A private copy of FNV-1a 64 (kv-block.md) so src/rng does not depend on the
// codec module's schedule; stream names are short, so bigint speed is irrelevant.
const OFFSET_BASIS = 0xcbf29ce484222325n;
const PRIME = 0x100000001b3n;
const encoder = new TextEncoder();

export function fnv1a64Utf8(text: string): bigint {
  let h = OFFSET_BASIS;
  for (const byte of encoder.encode(text)) {
    h = BigInt.asUintN(64, (h ^ BigInt(byte)) * PRIME);
  }
  return h;
}
