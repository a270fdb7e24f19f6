import type { ModelConfig } from "../compute/index.ts";
import { DTYPES, type DType, type Matrix } from "../compute/index.ts";
import { castWeights, type Weights } from "../compute/index.ts";

/**
 * The weights as the engine holds them for `--dtype`: the option's dtype, or for "as-stored" the
 * file's when it is one the kernels read, else f32. Matrices the loader already kept packed in
 * it pass through untouched (castMatrix returns them as they are); any f32 ones are packed here.
 */
export function holdWeights(cfg: ModelConfig, weights: Weights<Matrix>, storedDType: string, opt: DType | "as-stored" = "as-stored"): Weights<Matrix> {
  const held = opt !== "as-stored" ? opt : (DTYPES as readonly string[]).includes(storedDType) ? (storedDType as DType) : "as-stored";
  return castWeights(cfg, weights, held);
}
