// FNV-1a 64 and the chained block hash (kv-block.md, "Block hash").
//
// The 64-bit state lives in two 32-bit halves held in plain numbers: a BigInt
// multiply per byte would allocate on every byte of every prompt. The prime is
// 2^40 + 0x1b3, so h·prime mod 2^64 = h·0x1b3 + (lo << 40); lo·0x1b3 < 2^41 stays
// exact in a double, and only its carry reaches the high half.

const BASIS_LO = 0x84222325;
const BASIS_HI = 0xcbf29ce4;
const PRIME_LO = 0x1b3;
const TWO_32 = 4294967296;

// State of the fold in progress; module-level so the hot loops allocate nothing.
let lo = 0;
let hi = 0;

function reset(): void {
  lo = BASIS_LO;
  hi = BASIS_HI;
}

function step(byte: number): void {
  const x = (lo ^ byte) >>> 0;
  const m = x * PRIME_LO;
  hi = (Math.imul(hi, PRIME_LO) + (x << 8) + ((m / TWO_32) | 0)) >>> 0;
  lo = m >>> 0;
}

function stepU32(v: number): void {
  step(v & 0xff);
  step((v >>> 8) & 0xff);
  step((v >>> 16) & 0xff);
  step(v >>> 24);
}

function result(): bigint {
  return (BigInt(hi) << 32n) | BigInt(lo);
}

export function fnv1a64(bytes: Uint8Array): bigint {
  reset();
  for (let i = 0; i < bytes.length; i++) step(bytes[i]!);
  return result();
}

// Folds le64(parent) || le32(tokens[0..n)) into the state; 0 becomes 1 ("no hash").
function chain(parentLo: number, parentHi: number, tokens: ArrayLike<number>, from: number, n: number): void {
  reset();
  stepU32(parentLo);
  stepU32(parentHi);
  for (let i = from; i < from + n; i++) {
    const t = tokens[i]!;
    if (!(Number.isInteger(t) && t >= 0 && t <= 0xffffffff)) {
      throw new Error(`token ${t} at index ${i} is not a u32`);
    }
    stepU32(t);
  }
  if (lo === 0 && hi === 0) lo = 1;
}

/** h = FNV1a64(le64(parent) || le32(tokens...)), with 0 replaced by 1. */
export function blockHash(parent: bigint, tokens: ArrayLike<number>): bigint {
  if (parent < 0n || parent > 0xffffffffffffffffn) throw new Error(`parent hash ${parent} is not a u64`);
  chain(Number(parent & 0xffffffffn), Number(parent >> 32n), tokens, 0, tokens.length);
  return result();
}

/** Chained hashes of the full blocks of a prompt, h_{-1} = 0; a partial tail gets none. */
export function promptHashes(tokens: ArrayLike<number>, blockTokens: number): bigint[] {
  if (!(Number.isInteger(blockTokens) && blockTokens >= 1)) throw new Error(`blockTokens ${blockTokens} must be ≥ 1`);
  const full = Math.floor(tokens.length / blockTokens);
  const out: bigint[] = new Array(full);
  let pLo = 0;
  let pHi = 0;
  for (let b = 0; b < full; b++) {
    chain(pLo, pHi, tokens, b * blockTokens, blockTokens);
    pLo = lo;
    pHi = hi;
    out[b] = result();
  }
  return out;
}
