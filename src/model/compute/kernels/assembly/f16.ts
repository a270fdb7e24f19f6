// f16 to f32 conversions shared by the kernels: exact for every finite f16.

/** f16 bits (low 16 of h) to f32, exact for finite values as f16x4 (normals rebias, subnormals are m * 2^-24). */
@inline export function f16ToF32(h: u32): f32 {
  const sign = (h & 0x8000) << 16;
  const em = h & 0x7fff;
  if (em < 0x400) {
    const m = <f32>em * reinterpret<f32>(0x33800000); // 2^-24
    return reinterpret<f32>(reinterpret<u32>(m) | sign);
  }
  return reinterpret<f32>(((em << 13) + (112 << 23)) | sign);
}

/**
 * THE SHIFTED F16. An f16 below 2^-14 in magnitude (subnormal) widens through an f32 subnormal,
 * and x86 takes a microcode assist for each multiply with one (about a hundred cycles;
 * WebAssembly keeps denormals). Trained models hold about 0.2%, each mostly in a vector of its
 * own: on such weights a one-token f16 matrix read 11.0-11.8 GB/s from DRAM plain and 15.2-15.4
 * shifted (AMD EPYC, one thread, bench/kernel-bounds.ts WEIGHTS=gauss,
 * kernel-bounds.s13-f16-shifted-gauss.json). So f16 weights are placed with the exponent field raised by 10 (f16Shift), the
 * value then being 2^(e - 25) (1 + m / 1024): a subnormal m * 2^-24 becomes a normal of exponent
 * k + 1 (k = its top bit), a normal's field e becomes e + 10, zero stays zero. The 5-bit field
 * holds e + 10 only while e <= 21, so the coding holds every |w| < 128 (h & 0x7fff < 0x5800);
 * a matrix with a larger weight stays in the plain coding. Widened as f16bits widens a plain
 * pattern, a shifted one is the value times 2^-102, normal for every weight but zero: the kernels
 * rebias by 2^102 (or scale x by it) where the plain coding takes 2^112.
 */
@inline export function f16Shift(h: u32): u32 {
  const em = h & 0x7fff;
  if (em == 0) return h;
  if (em >= 0x400) return h + 0x2800;
  const k = 31 - clz(em);
  return (h & 0x8000) | (<u32>(k + 1) << 10) | ((em << (10 - k)) & 0x3ff);
}

/** A shifted f16 pattern (low 16 bits of h) to f32, exactly. */
@inline export function f16sToF32(h: u32): f32 {
  return reinterpret<f32>(((h & 0x7fff) << 13) | ((h & 0x8000) << 16)) * reinterpret<f32>(0x72800000);
}

/** Shifted f16 patterns in the top halves of i32 lanes to f32x4, as f16x4 does plain ones. */
@inline export function f16sx4(t: v128): v128 {
  return rebiasShifted(topBits(t));
}

/** f16bits' patterns of shifted f16 (the values times 2^-102) times 2^102: the values as f32 (exact). */
@inline export function rebiasShifted(bits: v128): v128 {
  return f32x4.mul(bits, f32x4.splat(reinterpret<f32>(0x72800000)));
}

/** Four 16-bit patterns at p, each moved to the top half of an i32 lane (low half zero). */
@inline export function top16x4(p: usize): v128 {
  return i8x16.shuffle(f32x4.splat(0), v128.load64_zero(p), 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
}

/**
 * f16 patterns in the top halves of i32 lanes to f32x4 (whatever the low halves hold): sign and
 * exponent-mantissa moved to f32's places (shift right 3 keeping the sign, clear the three copies
 * and what came down from the low half), then times 2^112 to rebias. Exact for every finite f16, subnormals included (they pass through f32 subnormals);
 * inf and NaN would come out finite, so MatmulKernel refuses f16 weights holding them.
 */
@inline export function f16x4(t: v128): v128 {
  return rebias(topBits(t));
}

/** f16x4 before the rebias: the f16bits patterns of 16-bit patterns in the top halves of i32 lanes. */
@inline export function topBits(t: v128): v128 {
  return v128.and(i32x4.shr_s(t, 3), i32x4.splat(0x8fffe000));
}

/**
 * f16 patterns sign-extended into i32 lanes to f32x4, exact for every finite f16 like f16x4:
 * times 2^13 moves sign and exponent-mantissa to f32's places, the mask clears the sign's copies,
 * times 2^112 rebiases. A multiply rather than a shift: JavaScriptCore moves the count of every
 * WebAssembly vector shift through a scalar register, a multiply by a constant is one instruction.
 */
@inline export function f16ext(h: v128): v128 {
  return rebias(f16bits(h));
}

/** f16bits' patterns (the f16 values times 2^-112) times 2^112: the f16 values as f32 (exact). */
@inline export function rebias(bits: v128): v128 {
  return f32x4.mul(bits, f32x4.splat(reinterpret<f32>(0x77800000)));
}

/**
 * f16ext for the scales of quantized blocks, without an f32 subnormal on the way. f16ext's rebias
 * multiplies a subnormal f32 when the f16 is subnormal (below 2^-14), and x86 takes a microcode
 * assist of about a hundred cycles for each such multiply (WebAssembly keeps denormals, so the
 * denormals-are-zero mode is off). A block scale often is subnormal: a q6_k d near 2^-17 is
 * typical (the largest 16-weight scale over 128), so a q6_k matrix took 1.5x the time it takes
 * now (one thread, 2048 x 8192, one token, alternating builds; bench/kernel-bounds.ts' q6_k, this
 * and kquants.ts' strip walk together: 9.8 -> 15.8 GB/s from L2, 5.3 -> 9.0 from DRAM). Four normals take
 * f16ext (one test and a branch more); otherwise normals rebias by an integer add and subnormals
 * are their integer m times 2^-24, both operands normal, the lane's sign or-ed in after (f16extSafe):
 * the same f32 values as f16ext gives, for every finite f16.
 */
@inline export function f16extScale(h: v128): v128 {
  if (i32x4.all_true(i32x4.ge_s(v128.and(h, i32x4.splat(0x7fff)), i32x4.splat(0x400)))) return f16ext(h);
  return f16extSafe(h);
}

/** f16extScale's path for a subnormal: exact for every finite f16, no f32 subnormal operand. */
@inline function f16extSafe(h: v128): v128 {
  const em = v128.and(h, i32x4.splat(0x7fff));
  const normal = i32x4.add(i32x4.mul(em, i32x4.splat(8192)), i32x4.splat(112 << 23));
  const sub = f32x4.mul(f32x4.convert_i32x4_s(em), f32x4.splat(reinterpret<f32>(0x33800000)));
  const v = v128.bitselect(sub, normal, i32x4.lt_s(em, i32x4.splat(0x400)));
  return v128.or(v, v128.and(h, i32x4.splat(0x80000000)));
}

/** f16ext before the rebias: the f32 whose value is the f16's times 2^-112 (exact). */
@inline export function f16bits(h: v128): v128 {
  return v128.and(i32x4.mul(h, i32x4.splat(8192)), i32x4.splat(0x8fffe000));
}

/**
 * f16bits of the f16 patterns in the low halves of v's i32 lanes (high halves ignored): one
 * 16-bit dot product (x86 pmaddwd) does the sign extension and the times 2^13 at once,
 * low * 8192 + high * 0; the mask then clears the sign's copies as in f16bits.
 *
 * Two operations per four weights, twice bf16's one. No single operation does it whatever the
 * 16 bits hold: the pattern needs the sign at bit 31 and the exponent-mantissa at 13..27, so
 * both halves of the lane; a dot product alone cannot give the patterns of -k * 2^-24, k = 1..7
 * (0x80002000 ..: as i32 below -2^31 + 2^16, which no sum of two products of 16-bit values
 * reaches), and a lane holding one weight ready for an and leaves the other no run of 15 free
 * bits to move into place.
 */
@inline export function f16bitsLo(v: v128): v128 {
  return v128.and(i32x4.dot_i16x8_s(v, i16x8(8192, 0, 8192, 0, 8192, 0, 8192, 0)), i32x4.splat(0x8fffe000));
}

/** f16bits of the patterns in the high halves of v's i32 lanes (low * 0 + high * 8192). */
@inline export function f16bitsHi(v: v128): v128 {
  return v128.and(i32x4.dot_i16x8_s(v, i16x8(0, 8192, 0, 8192, 0, 8192, 0, 8192)), i32x4.splat(0x8fffe000));
}
