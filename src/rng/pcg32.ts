import assert from "node:assert";
import { fnv1a64Utf8 } from "./fnv1a64.ts";

// 6364136223846793005 = 0x5851f42d_4c957f2d, split so the hot path stays in
// 32-bit number arithmetic instead of allocating a bigint per step.
const MULT = 6364136223846793005n;
const MULT_HI = 0x5851f42d;
const MULT_LO = 0x4c957f2d;
const TWO_32 = 0x1_0000_0000;
const U64_MASK = (1n << 64n) - 1n;

/** Name of the stream tokens are drawn from (random-stream.md, "Named streams"). */
export const SAMPLE_STREAM = "sample";

/**
 * PCG-XSH-RR 64/32, exactly as random-stream.md. The 64-bit state and increment are kept
 * as unsigned 32-bit halves in plain numbers; every product is split so that no
 * intermediate exceeds 2^53, which keeps each step exact.
 */
export class Pcg32 {
  private stateHi: number;
  private stateLo: number;
  private incHi: number;
  private incLo: number;

  private constructor(state: bigint, inc: bigint) {
    assert((inc & 1n) === 1n, `pcg32 increment must be odd, got 0x${inc.toString(16)}`);
    this.stateHi = Number(state >> 32n);
    this.stateLo = Number(state & 0xffff_ffffn);
    this.incHi = Number(inc >> 32n);
    this.incLo = Number(inc & 0xffff_ffffn);
  }

  /** seed(initstate, initseq) of random-stream.md; both arguments are taken mod 2^64. */
  static seeded(initstate: bigint, initseq: bigint): Pcg32 {
    const inc = BigInt.asUintN(64, (initseq << 1n) | 1n);
    const rng = new Pcg32(0n, inc);
    rng.nextU32();
    rng.setState(BigInt.asUintN(64, rng.state + initstate));
    rng.nextU32();
    return rng;
  }

  /** Rebuilds a generator from raw state (tests, persistence); `inc` must be odd. */
  static fromState(state: bigint, inc: bigint): Pcg32 {
    return new Pcg32(BigInt.asUintN(64, state), BigInt.asUintN(64, inc));
  }

  get state(): bigint {
    return (BigInt(this.stateHi) << 32n) | BigInt(this.stateLo);
  }

  get inc(): bigint {
    return (BigInt(this.incHi) << 32n) | BigInt(this.incLo);
  }

  private setState(state: bigint): void {
    this.stateHi = Number(state >> 32n);
    this.stateLo = Number(state & 0xffff_ffffn);
  }

  /** One PCG step; returns an unsigned 32-bit integer. */
  nextU32(): number {
    const hi = this.stateHi;
    const lo = this.stateLo;

    // Output from the old state: xorshifted = u32(((old >> 18) ^ old) >> 27).
    const xHi = hi ^ (hi >>> 18);
    const xLo = lo ^ ((lo >>> 18) | (hi << 14));
    const xorshifted = ((xLo >>> 27) | (xHi << 5)) >>> 0;
    const rot = hi >>> 27;
    const out = ((xorshifted >>> rot) | (xorshifted << ((32 - rot) & 31))) >>> 0;

    // state = old * MULT + inc (mod 2^64). lo*MULT_LO needs its full 64 bits, so it
    // is done in 16-bit pieces; the cross terms only feed the high word (mod 2^32).
    const a0 = lo & 0xffff;
    const a1 = lo >>> 16;
    const b0 = MULT_LO & 0xffff;
    const b1 = MULT_LO >>> 16;
    const mid = a0 * b1 + a1 * b0; // < 2^33, exact
    const low = a0 * b0 + (mid % 0x10000) * 0x10000; // < 2^33, exact
    const lowCarry = low >= TWO_32 ? 1 : 0;
    const prodLo = low >>> 0;
    const prodHi = (a1 * b1 + Math.floor(mid / 0x10000) + lowCarry + Math.imul(hi, MULT_LO) + Math.imul(lo, MULT_HI)) >>> 0;

    const sumLo = prodLo + this.incLo;
    this.stateLo = sumLo >>> 0;
    this.stateHi = (prodHi + this.incHi + (sumLo >= TWO_32 ? 1 : 0)) >>> 0;
    return out;
  }

  /** One draw of random-stream.md: two nextU32 calls, 53 random bits, in [0, 1). */
  uniformF64(): number {
    const a = this.nextU32() >>> 5;
    const b = this.nextU32() >>> 6;
    return (a * 67108864 + b) / 9007199254740992;
  }

  /**
   * Moves the generator by `delta` steps (nextU32 calls) in O(log delta), by
   * composing the LCG's affine map (Brown, "Random number generation with
   * arbitrary strides"). Negative deltas go backwards (delta is taken mod 2^64).
   */
  advance(delta: bigint): void {
    let d = BigInt.asUintN(64, delta);
    let curMult = MULT;
    let curPlus = this.inc;
    let accMult = 1n;
    let accPlus = 0n;
    while (d > 0n) {
      if ((d & 1n) === 1n) {
        accMult = (accMult * curMult) & U64_MASK;
        accPlus = (accPlus * curMult + curPlus) & U64_MASK;
      }
      curPlus = ((curMult + 1n) * curPlus) & U64_MASK;
      curMult = (curMult * curMult) & U64_MASK;
      d >>= 1n;
    }
    this.setState((accMult * this.state + accPlus) & U64_MASK);
  }

  /** Becomes a copy of `other` (state and stream), allocating nothing: a scratch generator reused per step. */
  copyFrom(other: Pcg32): this {
    this.stateHi = other.stateHi;
    this.stateLo = other.stateLo;
    this.incHi = other.incHi;
    this.incLo = other.incLo;
    return this;
  }

  /** Writes state and increment as four Int32 words (hi, lo, hi, lo) at out[at..], with no bigint on the way. */
  writeWords(out: Int32Array, at: number): void {
    out[at] = this.stateHi | 0;
    out[at + 1] = this.stateLo | 0;
    out[at + 2] = this.incHi | 0;
    out[at + 3] = this.incLo | 0;
  }

  /** Takes state and increment from four words writeWords wrote (the increment must be odd). */
  readWords(from: Int32Array, at: number): this {
    // The message is built only on failure: a model thread reads a stream per sampled row per step.
    if ((from[at + 3]! & 1) !== 1) assert.fail(`pcg32 increment must be odd, got low word 0x${(from[at + 3]! >>> 0).toString(16)}`);
    this.stateHi = from[at]! >>> 0;
    this.stateLo = from[at + 1]! >>> 0;
    this.incHi = from[at + 2]! >>> 0;
    this.incLo = from[at + 3]! >>> 0;
    return this;
  }

  clone(): Pcg32 {
    return new Pcg32(this.state, this.inc);
  }
}

function toU64(seed: bigint | number): bigint {
  if (typeof seed === "number") {
    assert(Number.isSafeInteger(seed) && seed >= 0, `seed must be a non-negative safe integer, got ${seed}`);
    return BigInt(seed);
  }
  assert(seed >= 0n && seed <= U64_MASK, `seed must fit in u64, got ${seed}`);
  return seed;
}

/** stream(seed, name) = seeded(seed, FNV1a64(utf8(name))), random-stream.md "Named streams". */
export function stream(seed: bigint | number, name: string): Pcg32 {
  return Pcg32.seeded(toU64(seed), fnv1a64Utf8(name));
}

/**
 * The decode side of the hand-off: the sample stream after `draws` uniform draws
 * (2 * draws steps), so its next draw is the one a single engine would use next.
 */
export function resumeRng(seed: bigint | number, draws: number): Pcg32 {
  assert(Number.isSafeInteger(draws) && draws >= 0, `draws must be a non-negative integer, got ${draws}`);
  const rng = stream(seed, SAMPLE_STREAM);
  rng.advance(2n * BigInt(draws));
  return rng;
}
