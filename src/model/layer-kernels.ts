/**
 * The exports of the kernel module besides the matmuls (kernels/assembly/attention.ts and
 * elementwise.ts state their orders). Every argument that names memory is a byte offset into the
 * kernel's memory.
 */
export interface LayerKernelExports {
  attend(
    out: number,
    q: number,
    kv: number,
    att: number,
    attStride: number,
    firstPos: number,
    nr: number,
    B: number,
    blockBytes: number,
    nKv: number,
    kvMul: number,
    hd: number,
    qStride: number,
  ): void;
}
