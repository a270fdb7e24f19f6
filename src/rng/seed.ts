/** Seeds the engine chooses stay below 2^53: a client can send back the `x-tl-seed` it got as a JSON number. */
export const MAX_CHOSEN_SEED = 2 ** 53;

/** A random seed in [0, 2^53). */
export function randomSeed(): bigint {
  const [hi, lo] = crypto.getRandomValues(new Uint32Array(2));
  return (BigInt(hi! & 0x1f_ffff) << 32n) | BigInt(lo!);
}
