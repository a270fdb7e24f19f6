// CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF.
// Three implementations:
// - @node-rs/crc32 (one stream of SSE4.2 / ARMv8 CRC instructions): the default.
// - aws-crt's native checksums (the AWS Common Runtime's aws-c-checksums: carry-less multiply
//   folding), 2.5-4x faster on 32 KiB blocks (bench/codec.ts), only with TL_CRC32C=aws-crt: its
//   binding installs a crash handler that took the SIGPWR JavaScriptCore sends to suspend threads,
//   and killed engines running a model thread ("Signal received: 30" in a test run).
// - the slicing-by-8 table version, where neither loads.
// TL_CRC32C=aws-crt, =node-rs or =table picks one (benchmarks and tests compare them).

type CrcFn = (input: Uint8Array, initialState?: number | null) => number;

const POLY = 0x82f63b78;

// 8 tables of 256 entries, flat: T[k*256 + b] is the CRC of byte b followed by k zero bytes.
const T = new Uint32Array(8 * 256);
for (let b = 0; b < 256; b++) {
  let c = b;
  for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
  T[b] = c >>> 0;
}
for (let k = 1; k < 8; k++) {
  for (let b = 0; b < 256; b++) {
    const prev = T[(k - 1) * 256 + b]!;
    T[k * 256 + b] = (T[prev & 0xff]! ^ (prev >>> 8)) >>> 0;
  }
}

/**
 * Pure-TS slicing-by-8 CRC-32C. `initial` continues a previous result, as in
 * @node-rs/crc32: crc32cTable(b, crc32cTable(a)) === crc32cTable(a ++ b).
 */
export function crc32cTable(bytes: Uint8Array, initial = 0): number {
  let crc = ~initial;
  let i = 0;
  const n = bytes.length;
  // Bytes are read one at a time so any offset (subarray views included) works.
  for (const end8 = n - (n & 7); i < end8; i += 8) {
    const a = crc ^ (bytes[i]! | (bytes[i + 1]! << 8) | (bytes[i + 2]! << 16) | (bytes[i + 3]! << 24));
    crc =
      T[7 * 256 + (a & 0xff)]! ^
      T[6 * 256 + ((a >>> 8) & 0xff)]! ^
      T[5 * 256 + ((a >>> 16) & 0xff)]! ^
      T[4 * 256 + (a >>> 24)]! ^
      T[3 * 256 + bytes[i + 4]!]! ^
      T[2 * 256 + bytes[i + 5]!]! ^
      T[256 + bytes[i + 6]!]! ^
      T[bytes[i + 7]!]!;
  }
  for (; i < n; i++) crc = T[(crc ^ bytes[i]!) & 0xff]! ^ (crc >>> 8);
  return ~crc >>> 0;
}

/**
 * crc32c(le32(v), prev): the CRC of whatever gave `prev`, followed by the 4 bytes of `v`,
 * by table: cheaper than handing a native binding a 4-byte view.
 */
export function crc32cExtendU32(prev: number, v: number): number {
  let c = ~prev ^ v;
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  c = T[c & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
}

/** A binding that loads but computes something else must not be trusted. */
function checked(fn: CrcFn | undefined): CrcFn | null {
  return typeof fn === "function" && fn(new TextEncoder().encode("123456789"), 0) >>> 0 === 0xe3069283 ? fn : null;
}

function loadAwsCrt(): CrcFn | null {
  type Binding = { checksums_crc32c?: (input: Uint8Array, previous: number) => number };
  let mod: Binding;
  try {
    if (process.platform === "linux" && process.arch === "x64") {
      try {
        // A literal path, so `bun build --compile` embeds this binding in the binary.
        mod = require("aws-crt/dist/bin/linux-x64-glibc/aws-crt-nodejs.node") as Binding;
      } catch {
        mod = require("aws-crt/dist/bin/linux-x64-musl/aws-crt-nodejs.node") as Binding;
      }
    } else {
      const libc = process.platform === "linux" ? ["glibc", "musl"] : ["cruntime"];
      let found: Binding | undefined;
      for (const c of libc) {
        try {
          found = require(`aws-crt/dist/bin/${process.platform}-${process.arch}-${c}/aws-crt-nodejs.node`) as Binding;
          break;
        } catch {}
      }
      if (found === undefined) return null;
      mod = found;
    }
  } catch {
    return null;
  }
  const f = mod.checksums_crc32c;
  return typeof f === "function" ? checked((input, initial) => f(input, initial ?? 0)) : null;
}

function loadNodeRs(): CrcFn | null {
  try {
    // A literal require, so `bun build --compile` embeds the native binding in the binary.
    return checked((require("@node-rs/crc32") as { crc32c?: CrcFn }).crc32c);
  } catch {
    return null;
  }
}

export type Crc32cBackend = "aws-crt" | "node-rs" | "table";

function load(): { backend: Crc32cBackend; fn: CrcFn | null } {
  const want = process.env.TL_CRC32C;
  if (want === "table") return { backend: "table", fn: null };
  if (want === "aws-crt") {
    const aws = loadAwsCrt();
    if (aws) return { backend: "aws-crt", fn: aws };
  }
  const rs = loadNodeRs();
  return rs ? { backend: "node-rs", fn: rs } : { backend: "table", fn: null };
}

// Chosen on first use, not at import: a process that never checks a CRC (the gateway,
// which imports the codec for block hashes) never pays for loading a binding.
let active: { backend: Crc32cBackend; fn: CrcFn | null } | undefined;

/** Which implementation crc32c() runs (see the top of this file). */
export function crc32cBackend(): Crc32cBackend {
  return (active ??= load()).backend;
}

/** The native binding crc32c() runs, or null on the table fallback (tests and benchmarks compare against it). */
export function crc32cNative(): ((bytes: Uint8Array, initial?: number) => number) | null {
  const f = (active ??= load()).fn;
  return f ? (bytes, initial = 0) => f(bytes, initial) >>> 0 : null;
}

/** @node-rs/crc32 alone, or null when it does not load: the baseline bench/codec.ts compares the fastest against. */
export function crc32cNodeRs(): ((bytes: Uint8Array, initial?: number) => number) | null {
  active ??= load();
  const rs = active.backend === "node-rs" ? active.fn : loadNodeRs();
  return rs ? (bytes, initial = 0) => rs(bytes, initial) >>> 0 : null;
}

/** CRC-32C of `bytes` (unsigned). The native bindings read the view in place, no copy. */
export function crc32c(bytes: Uint8Array, initial = 0): number {
  const f = (active ??= load()).fn;
  return f !== null ? f(bytes, initial) >>> 0 : crc32cTable(bytes, initial);
}

// Combining CRCs (zlib's crc32_combine, for the Castagnoli polynomial): with the
// register as a polynomial over GF(2), crc(a ++ b) = crc(a)·x^(8·|b|) mod p ⊕ crc(b),
// the 0xFFFFFFFF pre- and post-conditioning cancelling between the two terms. So a
// cached CRC of a block's payload gives the CRC of any header + payload without
// reading the payload again.

/** a·b mod p, both reflected (bit 31 is x^0). */
function multModP(a: number, b: number): number {
  let p = 0;
  for (let m = 0x80000000; m !== 0; m >>>= 1) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) === 0) break;
    }
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

// X2N[k] = x^(2^k) mod p.
const X2N = new Uint32Array(32);
{
  let p = 0x40000000; // x^1
  X2N[0] = p;
  for (let k = 1; k < 32; k++) X2N[k] = p = multModP(p, p);
}

/**
 * The operator that shifts a CRC over `lenB` bytes (x^(8·lenB) mod p), for
 * crc32cCombineWith: computed once per length, it makes each combine 32 steps at most.
 */
export function crc32cCombineOp(lenB: number): number {
  if (!(Number.isSafeInteger(lenB) && lenB >= 0)) throw new Error(`length ${lenB} is not a byte count`);
  let p = 0x80000000; // x^0
  // n bits of lenB, starting at x^(2^3) since a byte is 8 bits.
  for (let n = lenB, k = 3; n > 0; n = Math.floor(n / 2), k++) {
    if (n % 2 === 1) p = multModP(X2N[k & 31]!, p);
  }
  return p;
}

/** crc32cCombine with the operator of crc32cCombineOp(|b|). */
export function crc32cCombineWith(op: number, crcA: number, crcB: number): number {
  return (multModP(op, crcA) ^ crcB) >>> 0;
}

/** CRC-32C of a ++ b from crcA = crc32c(a), crcB = crc32c(b) and lenB = b.length. */
export function crc32cCombine(crcA: number, crcB: number, lenB: number): number {
  return crc32cCombineWith(crc32cCombineOp(lenB), crcA, crcB);
}
