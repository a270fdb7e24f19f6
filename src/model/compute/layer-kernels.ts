/**
 * The exports of the kernel module besides the matmuls (kernels/assembly/attention.ts and
 * elementwise.ts state their orders). Every argument that names memory is a byte offset into the
 * kernel's memory.
 */
export interface LayerKernelExports {
  attend(
    out: number,
    q: number,
    table: number,
    layerOff: number,
    att: number,
    attStride: number,
    lin: number,
    firstPos: number,
    nr: number,
    B: number,
    nKv: number,
    kvMul: number,
    hd: number,
    qStride: number,
  ): void;
  /** Pieces c0 .. c1 of the attention dispatch at params (Transformer writes its layout). */
  attend_jobs(params: number, c0: number, c1: number, scratch: number): void;
  swiglu(h: number, g: number, n: number): void;
  add_into(x: number, y: number, n: number): void;
  to_f16(dst: number, src: number, n: number): void;
  rmsnorm(o: number, x: number, g: number, rows: number, dim: number, eps: number): void;
  rope(q: number, k: number, pos: number, cos: number, sin: number, rows: number, qDim: number, kvDim: number, hd: number): void;
  store_kv(dst: number, layerOff: number, vOff: number, k: number, v: number, rows: number, kvDim: number): void;
}
