// The weight dtypes as the kernels number them: kernel-threads.ts' KERNEL_INDEX, which a job's fn
// and place_rows' dt carry (kernel-exports.ts and q8-converter.ts write the same numbers).

export const F32: i32 = 0;
export const F16: i32 = 1;
export const BF16: i32 = 2;
export const Q8_0: i32 = 3;
export const Q4_K: i32 = 5;
export const Q6_K: i32 = 6;
export const Q4_0: i32 = 7;
export const Q4_1: i32 = 8;
export const Q5_0: i32 = 9;
export const Q5_1: i32 = 10;
export const Q5_K: i32 = 11;
/**
 * f16 weights placed in the shifted coding (f16.ts' THE SHIFTED F16): a kernel of its own,
 * not a file's dtype. 12 .. 15 are kernel-threads.ts' other job kinds.
 */
export const F16S: i32 = 16;
