/** A random seed in [0, 2^53): below 2^53, a client can send back the `x-tl-seed` it got as a JSON number. */
export function randomSeed(): bigint {
  const [hi, lo] = crypto.getRandomValues(new Uint32Array(2));
  return (BigInt(hi! & 0x1f_ffff) << 32n) | BigInt(lo!);
}

const U64_MASK = (1n << 64n) - 1n;

/** The seed of choice `index` of a request (vLLM: seed + index), so n > 1 samples differ but each is reproducible. */
export function choiceSeed(seed: bigint, index: number): bigint {
  return (seed + BigInt(index)) & U64_MASK;
}
