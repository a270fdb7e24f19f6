import { describe, expect, test } from "bun:test";
import { fromF16Bits, roundF16, toF16Bits } from "../../src/codec/index.ts";
import { xorshift } from "./support.ts";

// Independent double -> binary16, round to nearest even, by integer arithmetic on the
// exact binary expansion (a double is m·2^e with m < 2^53).
function refBits(x: number): number {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (a === Infinity) return sign | 0x7c00;
  if (a === 0) return sign;
  // Scale to units of 2^-24 (the subnormal step) while the exponent is small enough.
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  const q = Math.max(e, -14) - 10; // value of one ulp at this exponent
  const scaled = a / 2 ** q; // exact: a power-of-two scaling
  let m = Math.floor(scaled);
  const rem = scaled - m;
  if (rem > 0.5 || (rem === 0.5 && m & 1)) m++;
  // m counts ulps of 2^q; renormalise if rounding carried into the next binade.
  let exp = q + 10; // unbiased exponent of the leading bit
  if (m >= 2048) {
    m /= 2;
    exp++;
  }
  if (m < 1024) return sign | m; // subnormal (exp field 0)
  if (exp > 15) return sign | 0x7c00;
  return sign | ((exp + 15) << 10) | (m - 1024);
}

describe("f16", () => {
  test("known values, ties to even, subnormals, overflow", () => {
    expect(toF16Bits(1)).toBe(0x3c00);
    expect(toF16Bits(-2)).toBe(0xc000);
    expect(toF16Bits(0.5)).toBe(0x3800);
    expect(toF16Bits(65504)).toBe(0x7bff);
    expect(toF16Bits(65519.99)).toBe(0x7bff);
    expect(toF16Bits(65520)).toBe(0x7c00); // tie between 65504 and 2^16 goes to even: infinity
    expect(toF16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie -> even mantissa
    expect(toF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(toF16Bits(1 + 2 ** -11 + 2 ** -40)).toBe(0x3c01); // no double rounding through f32
    expect(toF16Bits(2 ** -24)).toBe(0x0001);
    expect(toF16Bits(2 ** -25)).toBe(0x0000);
    expect(toF16Bits(2 ** -25 * (1 + 2 ** -30))).toBe(0x0001);
    expect(toF16Bits(2 ** -14 - 2 ** -24)).toBe(0x03ff);
    expect(toF16Bits(-0)).toBe(0x8000);
    expect(toF16Bits(Infinity)).toBe(0x7c00);
    expect(toF16Bits(-Infinity)).toBe(0xfc00);
    const nan = toF16Bits(NaN);
    expect(nan & 0x7c00).toBe(0x7c00);
    expect(nan & 0x3ff).not.toBe(0);
    expect(fromF16Bits(0x0001)).toBe(2 ** -24);
    expect(fromF16Bits(0x7bff)).toBe(65504);
    expect(fromF16Bits(0xfc00)).toBe(-Infinity);
    expect(Object.is(fromF16Bits(0x8000), -0)).toBe(true);
    expect(fromF16Bits(0x7c01)).toBeNaN();
    expect(fromF16Bits(0xfe00)).toBeNaN();
    expect(roundF16(0.1)).toBe(fromF16Bits(0x2e66));
  });

  test("every non-NaN bit pattern round-trips", () => {
    for (let b = 0; b < 0x10000; b++) {
      const v = fromF16Bits(b);
      if ((b & 0x7c00) === 0x7c00 && (b & 0x3ff) !== 0) {
        expect(Number.isNaN(v)).toBe(true);
        continue;
      }
      if (toF16Bits(v) !== b) throw new Error(`bits 0x${b.toString(16)} -> ${v} -> 0x${toF16Bits(v).toString(16)}`);
    }
  });

  test("matches an arithmetic reference on random doubles", () => {
    const rnd = xorshift(1234);
    const f64 = new Float64Array(1);
    const u32 = new Uint32Array(f64.buffer);
    for (let i = 0; i < 20000; i++) {
      // Exponents concentrated around the f16 range, full random mantissas.
      const exp = (rnd() % 50) - 30;
      u32[0] = rnd();
      u32[1] = (rnd() & 0x800fffff) | (((exp + 1023) & 0x7ff) << 20);
      const x = f64[0]!;
      if (toF16Bits(x) !== refBits(x)) throw new Error(`${x}: got 0x${toF16Bits(x).toString(16)}, want 0x${refBits(x).toString(16)}`);
    }
    // Midpoints between neighbours, and just either side of them.
    for (let b = 0; b < 0x7bff; b += 37) {
      const mid = (fromF16Bits(b) + fromF16Bits(b + 1)) / 2;
      for (const x of [mid, mid * (1 + 2 ** -40), mid * (1 - 2 ** -40)]) expect(toF16Bits(x)).toBe(refBits(x));
    }
  });
});
