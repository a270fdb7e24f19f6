// The kernel module's exports, and only these: what MatmulKernel and its helper threads call
// (src/model/compute/kernel-exports.ts types them). scripts/build-kernels.mjs builds the module
// from this one entry, so a helper another kernel file imports (kquants.ts' relaxed dot, say)
// stays inside the module instead of becoming an export with v128 in its signature.

export { matmul_bf16, matmul_f16, matmul_f16s, matmul_f32 } from "./matmul";
export { convert_q8_rows } from "./convert";
export { first_bad, place_rows, places } from "./place-strips";
export { matmul_q8_0, q8_row_bytes, quantize_q8_x } from "./q8";
export { k_row_bytes, matmul_q4_k, matmul_q5_k, matmul_q6_k, quantize_k_x } from "./kquants";
export { l_row_bytes, matmul_q4_0, matmul_q4_1, matmul_q5_0, matmul_q5_1, quantize_l_x } from "./legacy";
export { matmul_one_token, matmul_tiled, quantize_rows, run_chunks, touch_pages, x_row_bytes } from "./dispatch";
export { attend, attend_jobs } from "./attention";
export { add_into, rmsnorm, rope, store_kv, swiglu, to_f16 } from "./elementwise";
