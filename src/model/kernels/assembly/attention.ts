// Causal grouped-query attention over K/V copied from the paged f16 cache, in AssemblyScript
// (built with matmul.ts into one module by scripts/build-kernels.mjs).
//
// kv holds the blocks of one sequence for one layer, back to back: block b's K section
// [B][H][D] f16 then its V section, `blockBytes` apart. Query row j (position firstPos + j) of
// head g*kvMul + h attends to positions 0 .. firstPos + j, reading q and writing out at
// (j * qStride + (g*kvMul + h) * hd) floats.
//
// THE ORDER, fixed whatever rows are computed together: each score is a dot over the head
// dimension in the matmul order (four lanes by i mod 4, folded (s0 + s1) + (s2 + s3), the tail in
// order), divided by sqrt(hd); softmax subtracts the max, exponentiates (AssemblyScript's own
// expf, the same bits on every engine), sums t = 0.. in order and divides; each output element
// sums att[t] * v[t][i] over t = 0.. in order. All in f32.

import { f16ToF32, f16x4, top16x4 } from "./f16";

@inline function kAt(kv: usize, t: i32, B: i32, blockBytes: usize, kvDim: i32, off: i32): usize {
  const b = t / B;
  return kv + <usize>b * blockBytes + ((<usize>(t - b * B) * <usize>kvDim + <usize>off) << 1);
}

@inline function score(qp: usize, kp: usize, hd: i32): f32 {
  let acc = f32x4.splat(0);
  const hd4 = hd & ~3;
  for (let i = 0; i < hd4; i += 4) acc = f32x4.add(acc, f32x4.mul(v128.load(qp + (<usize>i << 2)), f16x4(top16x4(kp + (<usize>i << 1)))));
  let s = (f32x4.extract_lane(acc, 0) + f32x4.extract_lane(acc, 1)) + (f32x4.extract_lane(acc, 2) + f32x4.extract_lane(acc, 3));
  for (let i = hd4; i < hd; i++) s += load<f32>(qp + (<usize>i << 2)) * f16ToF32(<u32>load<u16>(kp + (<usize>i << 1)));
  return s;
}

export function attend(
  out: usize,
  q: usize,
  kv: usize,
  att: usize,
  firstPos: i32,
  nr: i32,
  B: i32,
  blockBytes: usize,
  nKv: i32,
  kvMul: i32,
  hd: i32,
  qStride: i32,
): void {
  const kvDim = nKv * hd;
  const vOff = <usize>B * <usize>kvDim * 2;
  const sqrtHd = Mathf.sqrt(<f32>hd);
  const hd4 = hd & ~3;
  for (let j = 0; j < nr; j++) {
    const len = firstPos + j + 1;
    for (let g = 0; g < nKv; g++) {
      for (let h = 0; h < kvMul; h++) {
        const o = (<usize>j * <usize>qStride + <usize>((g * kvMul + h) * hd)) << 2;
        const qp = q + o;
        let max = -Infinity as f32;
        for (let t = 0; t < len; t++) {
          const s = score(qp, kAt(kv, t, B, blockBytes, kvDim, g * hd), hd) / sqrtHd;
          store<f32>(att + (<usize>t << 2), s);
          if (s > max) max = s;
        }
        let sum: f32 = 0;
        for (let t = 0; t < len; t++) {
          const e = Mathf.exp(load<f32>(att + (<usize>t << 2)) - max);
          store<f32>(att + (<usize>t << 2), e);
          sum += e;
        }
        for (let t = 0; t < len; t++) store<f32>(att + (<usize>t << 2), load<f32>(att + (<usize>t << 2)) / sum);
        // out = sum over t in order of att[t] * v[t], position by position over the row.
        const op = out + o;
        for (let i = 0; i < hd; i++) store<f32>(op + (<usize>i << 2), 0);
        for (let t = 0; t < len; t++) {
          const p = load<f32>(att + (<usize>t << 2));
          const pv = f32x4.splat(p);
          const vp = kAt(kv, t, B, blockBytes, kvDim, g * hd) + vOff;
          for (let i = 0; i < hd4; i += 4) {
            const a = op + (<usize>i << 2);
            v128.store(a, f32x4.add(v128.load(a), f32x4.mul(pv, f16x4(top16x4(vp + (<usize>i << 1))))));
          }
          for (let i = hd4; i < hd; i++) {
            const a = op + (<usize>i << 2);
            store<f32>(a, load<f32>(a) + p * f16ToF32(<u32>load<u16>(vp + (<usize>i << 1))));
          }
        }
      }
    }
  }
}
