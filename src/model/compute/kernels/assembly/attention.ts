// Causal grouped-query attention over the paged f16 cache, in AssemblyScript (built with
// matmul.ts into one module by scripts/build-kernels.mjs).
//
// A sequence's blocks are found through its table: i32 byte addresses, block b's at table + 4b;
// its layer's K section [B][H][D] f16 starts layerOff bytes further, its V section right after
// (the KV pool's v1 block layout, read in place). Query row j (position firstPos + j) of head
// g*kvMul + h attends to positions 0 .. firstPos + j, reading q and writing out at
// (j * qStride + (g*kvMul + h) * hd) floats.
//
// THE ORDER, fixed whatever rows are computed together: each score is a dot over the head
// dimension in the matmul order (four lanes by i mod 4, folded (s0 + s1) + (s2 + s3), the tail in
// order), divided by sqrt(hd); softmax subtracts the max, exponentiates (math.ts's exp4, the same
// bits on every engine), sums in the matmul order over t and divides; each output element
// sums att[t] * v[t][i] over t = 0.. in order, from +0. All in f32.
//
// Tiles only decide which queries share the loads: the queries of one KV head (a row's kvMul
// heads, then the next row's) go four at a time over that head's K and V made f32 first (exact),
// so each K or V chunk is loaded once for four of them and four sums are in flight. Fewer than
// four queries per KV head (decode) read the f16 blocks directly, all heads of a position
// together, as f16bits' patterns (the values times 2^-112) against the query and the softmax
// weights scaled by 2^112: each product is the same real number, so rounds the same, for a
// third of the widening's work (a query with an element of 2^16 or more keeps the rebiased K).
// A query never sums a term past its own position, so no tile changes a bit.

import { f16bitsHi, f16bitsLo, f16ext, f16ToF32, f16x4, top16x4, topBits } from "./f16";
import { exp1, exp4 } from "./math";

/**
 * One attend call's parameters, as llama2.c passes Config* and RunState*: a record of i32 slots
 * in kernel memory (ATTEND_JOB in kernel-exports.ts names the same slots for TypeScript), read
 * through one pointer. `attend` takes it from its caller; attend_jobs writes one per piece at the
 * start of its thread's scratch (ATTEND_JOB_BYTES, which attentionScratchBytes counts in). Each
 * function reads the fields it needs into locals at entry, so no loop reloads them.
 */
@unmanaged class AttendJob {
  /** Byte addresses: the output rows, the query rows, the sequence's block table. */
  out: usize;
  q: usize;
  table: usize;
  /** Bytes from a block's start to this layer's K section. */
  layerOff: usize;
  /** Score scratch: 4 * nKv * attStride floats (attendStream), or 4 * attStride (attendHead). */
  att: usize;
  attStride: i32;
  /** attendHead's f32 K then V of one KV head: 2 * attStride * hd floats. */
  lin: usize;
  /** Row j of the nr rows sits at position firstPos + j. */
  firstPos: i32;
  nr: i32;
  /** Positions per block, KV heads, query heads per KV head, head dimension. */
  B: i32;
  nKv: i32;
  kvMul: i32;
  hd: i32;
  /** Floats from one query (and output) row to the next. */
  qStride: i32;
}
/** Bytes attend_jobs keeps for its AttendJob at the start of its scratch (14 slots, rounded so att stays 16-aligned). */
const ATTEND_JOB_BYTES: usize = 64;

/** The layer's V section, right after its K section: B * kvDim f16 past layerOff. */
@inline function vOffOf(job: AttendJob): usize {
  return job.layerOff + <usize>job.B * <usize>(job.nKv * job.hd) * 2;
}

/** attendHead's f32 V, after its f32 K at lin. */
@inline function vLinOf(job: AttendJob): usize {
  return job.lin + <usize>job.attStride * <usize>job.hd * 4;
}

/** Byte address of block b's section at layerOff: the layer's K, or its V at B * kvDim * 2 past. */
@inline function blockAt(table: usize, b: i32, layerOff: usize): usize {
  return <usize>load<i32>(table + (<usize>b << 2)) + layerOff;
}

@inline function fold(a: v128): f32 {
  return (f32x4.extract_lane(a, 0) + f32x4.extract_lane(a, 1)) + (f32x4.extract_lane(a, 2) + f32x4.extract_lane(a, 3));
}

@inline function ld(p: usize, i: i32): v128 {
  return v128.load(p + (<usize>i << 2));
}

@inline function kv4(p: usize, i: i32): v128 {
  return f16x4(top16x4(p + (<usize>i << 1)));
}

/** Elements i .. i+3 of the eight f16 at p + 2i loaded as v (kv8lo), and i+4 .. i+7 (kv8hi). */
@inline function kv8lo(v: v128): v128 {
  return f16ext(i32x4.extend_low_i16x8_s(v));
}

@inline function kv8hi(v: v128): v128 {
  return f16ext(i32x4.extend_high_i16x8_s(v));
}

/** acc + q[i .. i+8) * k[i .. i+8) in two steps of four (the matmul order), k eight f16 at kp + 2i. */
@inline function dot8(acc: v128, qp: usize, kp: usize, i: i32): v128 {
  const v = v128.load(kp + (<usize>i << 1));
  acc = f32x4.add(acc, f32x4.mul(ld(qp, i), kv8lo(v)));
  return f32x4.add(acc, f32x4.mul(ld(qp, i + 4), kv8hi(v)));
}

/** The n % 4 tail of a score: q[i] * k[i] for hd4 <= i < hd, in order. */
@inline function scoreTail(s: f32, qp: usize, kp: usize, hd4: i32, hd: i32): f32 {
  for (let i = hd4; i < hd; i++) s += load<f32>(qp + (<usize>i << 2)) * f16ToF32(<u32>load<u16>(kp + (<usize>i << 1)));
  return s;
}

/**
 * att[q][t] = q . k[t] / sqrt(hd) (the matmul order) for four queries at once over t < len (each
 * query's later positions are its own), into the job's four score rows, K already f32 and
 * contiguous in its lin (linearize): position t's vector at lin + t * hd floats.
 */
function scores4(job: AttendJob, q0: usize, q1: usize, q2: usize, q3: usize, len: i32): void {
  const att = job.att;
  const attStep = <usize>job.attStride << 2;
  const k = job.lin;
  const hd = job.hd;
  const hd4 = hd & ~3;
  const sqrtHd = Mathf.sqrt(<f32>hd);
  const rowBytes = <usize>hd << 2;
  let kp = k;
  let t = 0;
  // Two positions at a time (eight sums in flight, each q chunk loaded once for both), then one.
  for (; t + 2 <= len; t += 2, kp += 2 * rowBytes) {
    let a0 = f32x4.splat(0);
    let a1 = a0;
    let a2 = a0;
    let a3 = a0;
    let b0 = a0;
    let b1 = a0;
    let b2 = a0;
    let b3 = a0;
    const kq = kp + rowBytes;
    for (let i = 0; i < hd4; i += 4) {
      const ka = ld(kp, i);
      const kb = ld(kq, i);
      const x0 = ld(q0, i);
      const x1 = ld(q1, i);
      const x2 = ld(q2, i);
      const x3 = ld(q3, i);
      a0 = f32x4.add(a0, f32x4.mul(x0, ka));
      b0 = f32x4.add(b0, f32x4.mul(x0, kb));
      a1 = f32x4.add(a1, f32x4.mul(x1, ka));
      b1 = f32x4.add(b1, f32x4.mul(x1, kb));
      a2 = f32x4.add(a2, f32x4.mul(x2, ka));
      b2 = f32x4.add(b2, f32x4.mul(x2, kb));
      a3 = f32x4.add(a3, f32x4.mul(x3, ka));
      b3 = f32x4.add(b3, f32x4.mul(x3, kb));
    }
    const at = att + (<usize>t << 2);
    store<f32>(at, tailF32(fold(a0), q0, kp, hd4, hd) / sqrtHd);
    store<f32>(at + attStep, tailF32(fold(a1), q1, kp, hd4, hd) / sqrtHd);
    store<f32>(at + 2 * attStep, tailF32(fold(a2), q2, kp, hd4, hd) / sqrtHd);
    store<f32>(at + 3 * attStep, tailF32(fold(a3), q3, kp, hd4, hd) / sqrtHd);
    store<f32>(at + 4, tailF32(fold(b0), q0, kq, hd4, hd) / sqrtHd);
    store<f32>(at + 4 + attStep, tailF32(fold(b1), q1, kq, hd4, hd) / sqrtHd);
    store<f32>(at + 4 + 2 * attStep, tailF32(fold(b2), q2, kq, hd4, hd) / sqrtHd);
    store<f32>(at + 4 + 3 * attStep, tailF32(fold(b3), q3, kq, hd4, hd) / sqrtHd);
  }
  for (; t < len; t++, kp += rowBytes) {
    let a0 = f32x4.splat(0);
    let a1 = a0;
    let a2 = a0;
    let a3 = a0;
    for (let i = 0; i < hd4; i += 4) {
      const kk = ld(kp, i);
      a0 = f32x4.add(a0, f32x4.mul(ld(q0, i), kk));
      a1 = f32x4.add(a1, f32x4.mul(ld(q1, i), kk));
      a2 = f32x4.add(a2, f32x4.mul(ld(q2, i), kk));
      a3 = f32x4.add(a3, f32x4.mul(ld(q3, i), kk));
    }
    const at = att + (<usize>t << 2);
    store<f32>(at, tailF32(fold(a0), q0, kp, hd4, hd) / sqrtHd);
    store<f32>(at + attStep, tailF32(fold(a1), q1, kp, hd4, hd) / sqrtHd);
    store<f32>(at + 2 * attStep, tailF32(fold(a2), q2, kp, hd4, hd) / sqrtHd);
    store<f32>(at + 3 * attStep, tailF32(fold(a3), q3, kp, hd4, hd) / sqrtHd);
  }
}

/** The n % 4 tail of a score over an f32 k: q[i] * k[i] for hd4 <= i < hd, in order. */
@inline function tailF32(s: f32, qp: usize, kp: usize, hd4: i32, hd: i32): f32 {
  for (let i = hd4; i < hd; i++) s += load<f32>(qp + (<usize>i << 2)) * load<f32>(kp + (<usize>i << 2));
  return s;
}

/**
 * att[0 .. len) = softmax(att[0 .. len)): the max (lane-wise, which any order gives alike), then
 * e^(s - max) with the sum in the matmul order (four lanes by t mod 4, folded (s0 + s1) +
 * (s2 + s3), the tail in order), then each divided by the sum.
 */
function softmax(att: usize, len: i32): void {
  softmaxBy(att, len, false);
}

/** softmax with each weight then times 2^112 in the same pass (exactly: the weights lie in [0, 1]), for streamValues. */
function softmaxScaled(att: usize, len: i32): void {
  softmaxBy(att, len, true);
}

/** softmax(att, len), each weight also times 2^112 after its division when `scaled` (a constant at both calls). */
@inline function softmaxBy(att: usize, len: i32, scaled: bool): void {
  const len4 = len & ~3;
  let mx = f32x4.splat(-Infinity);
  for (let t = 0; t < len4; t += 4) mx = f32x4.max(mx, ld(att, t));
  let top = max(max(f32x4.extract_lane(mx, 0), f32x4.extract_lane(mx, 1)), max(f32x4.extract_lane(mx, 2), f32x4.extract_lane(mx, 3)));
  for (let t = len4; t < len; t++) top = max(top, load<f32>(att + (<usize>t << 2)));
  const m4 = f32x4.splat(top);
  let acc = f32x4.splat(0);
  for (let t = 0; t < len4; t += 4) {
    const e = exp4(f32x4.sub(ld(att, t), m4));
    v128.store(att + (<usize>t << 2), e);
    acc = f32x4.add(acc, e);
  }
  let sum = fold(acc);
  for (let t = len4; t < len; t++) {
    const e = exp1(load<f32>(att + (<usize>t << 2)) - top);
    store<f32>(att + (<usize>t << 2), e);
    sum += e;
  }
  // Lane-wise division rounds each element as the scalar one does.
  const s4 = f32x4.splat(sum);
  const k = f32x4.splat(X112);
  for (let t = 0; t < len4; t += 4) {
    const w = f32x4.div(ld(att, t), s4);
    v128.store(att + (<usize>t << 2), scaled ? f32x4.mul(w, k) : w);
  }
  for (let t = len4; t < len; t++) {
    const w = load<f32>(att + (<usize>t << 2)) / sum;
    store<f32>(att + (<usize>t << 2), scaled ? w * X112 : w);
  }
}

/** Adds att[t] * v[t][i .. i+4) for t0 <= t < t1 to o, in order; v f32 as in scores4. */
@inline function accumulate(o: v128, att: usize, t0: i32, t1: i32, v: usize, hd: i32, i: i32): v128 {
  const rowBytes = <usize>hd << 2;
  let vp = v + <usize>t0 * rowBytes + (<usize>i << 2);
  for (let t = t0; t < t1; t++, vp += rowBytes) o = f32x4.add(o, f32x4.mul(v128.load32_splat(att + (<usize>t << 2)), v128.load(vp)));
  return o;
}

/** Element i of sum over t < len of att[t] * v[t], in order; v f32 as in scores4. */
@inline function outTailF32(att: usize, len: i32, v: usize, hd: i32, i: i32): f32 {
  let s: f32 = 0;
  for (let t = 0; t < len; t++) s += load<f32>(att + (<usize>t << 2)) * load<f32>(v + ((<usize>t * <usize>hd + <usize>i) << 2));
  return s;
}

/**
 * out = sum over t < len of att[t] * v[t] for four queries whose lengths rise (len0 <= len1 <= len2 <= len3),
 * att the job's four weight rows, v f32 as in scores4 (vLinOf): every V chunk of a position all
 * four attend to is loaded once for the four; each then adds its own last positions.
 */
function values4(job: AttendJob, op0: usize, op1: usize, op2: usize, op3: usize, len0: i32, len1: i32, len2: i32, len3: i32): void {
  const att = job.att;
  const attStep = <usize>job.attStride << 2;
  const v = vLinOf(job);
  const hd = job.hd;
  const hd4 = hd & ~3;
  const att1 = att + attStep;
  const att2 = att1 + attStep;
  const att3 = att2 + attStep;
  const rowBytes = <usize>hd << 2;
  let i = 0;
  // Eight elements at a time (eight sums in flight), then four.
  for (; i + 8 <= hd4; i += 8) {
    let o0 = f32x4.splat(0);
    let o1 = o0;
    let o2 = o0;
    let o3 = o0;
    let p0 = o0;
    let p1 = o0;
    let p2 = o0;
    let p3 = o0;
    let vp = v + (<usize>i << 2);
    for (let t = 0; t < len0; t++, vp += rowBytes) {
      const va = v128.load(vp);
      const vb = v128.load(vp, 16);
      const at = <usize>t << 2;
      const a0 = v128.load32_splat(att + at);
      const a1 = v128.load32_splat(att1 + at);
      const a2 = v128.load32_splat(att2 + at);
      const a3 = v128.load32_splat(att3 + at);
      o0 = f32x4.add(o0, f32x4.mul(a0, va));
      p0 = f32x4.add(p0, f32x4.mul(a0, vb));
      o1 = f32x4.add(o1, f32x4.mul(a1, va));
      p1 = f32x4.add(p1, f32x4.mul(a1, vb));
      o2 = f32x4.add(o2, f32x4.mul(a2, va));
      p2 = f32x4.add(p2, f32x4.mul(a2, vb));
      o3 = f32x4.add(o3, f32x4.mul(a3, va));
      p3 = f32x4.add(p3, f32x4.mul(a3, vb));
    }
    o1 = accumulate(o1, att1, len0, len1, v, hd, i);
    o2 = accumulate(o2, att2, len0, len2, v, hd, i);
    o3 = accumulate(o3, att3, len0, len3, v, hd, i);
    p1 = accumulate(p1, att1, len0, len1, v, hd, i + 4);
    p2 = accumulate(p2, att2, len0, len2, v, hd, i + 4);
    p3 = accumulate(p3, att3, len0, len3, v, hd, i + 4);
    const a = <usize>i << 2;
    v128.store(op0 + a, o0);
    v128.store(op1 + a, o1);
    v128.store(op2 + a, o2);
    v128.store(op3 + a, o3);
    v128.store(op0 + a, p0, 16);
    v128.store(op1 + a, p1, 16);
    v128.store(op2 + a, p2, 16);
    v128.store(op3 + a, p3, 16);
  }
  for (; i < hd4; i += 4) {
    let o0 = f32x4.splat(0);
    let o1 = o0;
    let o2 = o0;
    let o3 = o0;
    let vp = v + (<usize>i << 2);
    for (let t = 0; t < len0; t++, vp += rowBytes) {
      const vv = v128.load(vp);
      const at = <usize>t << 2;
      o0 = f32x4.add(o0, f32x4.mul(v128.load32_splat(att + at), vv));
      o1 = f32x4.add(o1, f32x4.mul(v128.load32_splat(att1 + at), vv));
      o2 = f32x4.add(o2, f32x4.mul(v128.load32_splat(att2 + at), vv));
      o3 = f32x4.add(o3, f32x4.mul(v128.load32_splat(att3 + at), vv));
    }
    o1 = accumulate(o1, att1, len0, len1, v, hd, i);
    o2 = accumulate(o2, att2, len0, len2, v, hd, i);
    o3 = accumulate(o3, att3, len0, len3, v, hd, i);
    const a = <usize>i << 2;
    v128.store(op0 + a, o0);
    v128.store(op1 + a, o1);
    v128.store(op2 + a, o2);
    v128.store(op3 + a, o3);
  }
  for (let i = hd4; i < hd; i++) {
    const a = <usize>i << 2;
    store<f32>(op0 + a, outTailF32(att, len0, v, hd, i));
    store<f32>(op1 + a, outTailF32(att1, len1, v, hd, i));
    store<f32>(op2 + a, outTailF32(att2, len2, v, hd, i));
    store<f32>(op3 + a, outTailF32(att3, len3, v, hd, i));
  }
}

/** Positions t < n of KV head `off / hd`, f16 in the paged kv, as f32 at dst + t * hd floats (exact). */
function linearize(dst: usize, table: usize, secOff: usize, n: i32, B: i32, kvDim: i32, off: i32, hd: i32): void {
  const hd8 = hd & ~7;
  const hd4 = hd & ~3;
  const rowBytes = <usize>hd << 2;
  for (let t0 = 0, b = 0; t0 < n; t0 += B, b++) {
    let src = blockAt(table, b, secOff) + (<usize>off << 1);
    const m = min(B, n - t0);
    for (let s = 0; s < m; s++, src += <usize>kvDim << 1, dst += rowBytes) {
      // Eight at a time from one load, widened as dot8 widens (kv8lo, kv8hi: the same f32 as kv4's):
      // four at a time (a 64-bit load moved into place, a vector shift) took 5% of an 8-sequence
      // decode step of a 1B model under perf.
      let i = 0;
      for (; i < hd8; i += 8) {
        const v = v128.load(src + (<usize>i << 1));
        v128.store(dst + (<usize>i << 2), kv8lo(v));
        v128.store(dst + (<usize>i << 2), kv8hi(v), 16);
      }
      for (; i < hd4; i += 4) v128.store(dst + (<usize>i << 2), kv4(src, i));
      for (; i < hd; i++) store<f32>(dst + (<usize>i << 2), f16ToF32(<u32>load<u16>(src + (<usize>i << 1))));
    }
  }
}

/**
 * Rows j < nr of one sequence, the heads of KV heads g0 .. g1, when each KV head has fewer than
 * four queries (decode): too few to pay for making K and V f32 first, so the f16 blocks are read
 * in place, position by position across the heads (front to back, a stream the prefetcher
 * follows; head by head it would be a strided walk through memory). att holds nr * nHeads score
 * rows of attStride floats; the outputs sum in place from +0, each element in t order.
 */
function attendStream(job: AttendJob, g0: i32, g1: i32): void {
  const out = job.out;
  const q = job.q;
  const att = job.att;
  const attStride = job.attStride;
  const firstPos = job.firstPos;
  const nr = job.nr;
  const nKv = job.nKv;
  const kvMul = job.kvMul;
  const hd = job.hd;
  const qStride = job.qStride;
  const nH = nKv * kvMul;
  const attStep = <usize>attStride << 2;
  // The rows of att past the nr * nH score rows hold the query scaled by 2^112, when they fit.
  const qx = att + <usize>(nr * nH) * attStep;
  const roomy = <i64>(4 * nKv - nr * nH) * <i64>attStride >= <i64>(nH * hd);
  for (let j = 0; j < nr; j++) {
    const rowAtt = att + <usize>(j * nH) * attStep;
    const qRow = q + ((<usize>j * <usize>qStride) << 2);
    const len = firstPos + j + 1;
    if (roomy && scaleHeads(qx, qRow, hd, kvMul, g0, g1)) streamScoresX(job, qRow, qx, rowAtt, len, g0, g1);
    else streamScores(job, qRow, rowAtt, len, g0, g1);
    for (let h = g0 * kvMul; h < g1 * kvMul; h++) {
      softmaxScaled(rowAtt + <usize>h * attStep, len);
    }
    streamValues(job, out + ((<usize>j * <usize>qStride) << 2), rowAtt, len, g0, g1);
  }
}

/** 2^112: f16bits' patterns times a factor scaled by it are the products of the true values. */
const X112: f32 = reinterpret<f32>(0x77800000);

/**
 * The first block of the sequence of the piece after this thread's current one (its byte
 * address; 0 when there is none, or it is the same sequence's): the last block's touch-ahead
 * goes there, since a thread mostly takes its pieces in order.
 */
let nextFirst: usize = 0;

/**
 * The heads of KV heads g0 .. g1 of the query row q, their whole groups of four (i < hd & ~3),
 * times 2^112 into qx at the same offsets, when every |q| there is below 2^16 (so exactly, and
 * no product overflows); false (qx unspecified) otherwise, NaN included.
 */
function scaleHeads(qx: usize, q: usize, hd: i32, kvMul: i32, g0: i32, g1: i32): bool {
  const hd4 = hd & ~3;
  const k = f32x4.splat(X112);
  let m = f32x4.splat(0);
  for (let h = g0 * kvMul; h < g1 * kvMul; h++) {
    const o = <usize>(h * hd) << 2;
    for (let i = 0; i < hd4; i += 4) {
      const v = ld(q + o, i);
      m = f32x4.max(m, f32x4.abs(v));
      v128.store(qx + o + (<usize>i << 2), f32x4.mul(v, k));
    }
  }
  return max(max(f32x4.extract_lane(m, 0), f32x4.extract_lane(m, 1)), max(f32x4.extract_lane(m, 2), f32x4.extract_lane(m, 3))) < 65536;
}

/**
 * The eight f16 at p as f16bits' patterns (the values times 2^-112, exactly) in two f32x4,
 * elements 0..3 (lo) and 4..7 (hi): one shuffle pairs element l with l + 4 in lane l, then one
 * 16-bit dot product and an and per half (f16bitsLo, f16bitsHi), no rebias multiply: the other
 * factor is scaled by 2^112 instead. Four operations per eight, where f16ext takes eight.
 */
@inline function halves8(p: usize): v128 {
  const v = v128.load(p);
  return i8x16.shuffle(v, v, 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
}

/** f16bits' pattern of the f16 h (low 16 bits), as f32: its value times 2^-112, exactly. */
@inline function f16bits1(h: u32): f32 {
  return reinterpret<f32>(((<i32>(h << 16)) >> 3) & 0x8fffe000);
}

/**
 * streamScores with the query's groups of four scaled by 2^112 at qx (scaleHeads): each product
 * of a scaled query element and an f16bits pattern is the same real number as q * k, so rounds
 * the same, and every sum is the same. Each q chunk is loaded once for four positions. The last
 * group of four (hd % 8 >= 4) and the tail take q itself and k made f32 (as streamScores).
 * Long by design: the touch-ahead of the next block and the four sums live in one loop body,
 * whose registers a call would spill.
 */
function streamScoresX(job: AttendJob, q: usize, qx: usize, att: usize, len: i32, g0: i32, g1: i32): void {
  const table = job.table;
  const layerOff = job.layerOff;
  const attStep = <usize>job.attStride << 2;
  const B = job.B;
  const nKv = job.nKv;
  const kvMul = job.kvMul;
  const hd = job.hd;
  const hd4 = hd & ~3;
  const hd8 = hd & ~7;
  const sqrtHd = Mathf.sqrt(<f32>hd);
  const slotBytes = <usize>(nKv * hd) << 1;
  const nb = (len + B - 1) / B;
  // A whole sequence's piece (a batch) touches the next block's K and V sections whole; a piece
  // of a few KV heads (a small batch shared by the threads) only its heads' bytes of each slot,
  // leaving the other heads' lines to their own threads.
  const whole = g0 == 0 && g1 == nKv;
  const sectionLines = whole ? (B * nKv * hd * 4) >> 6 : 0;
  const from = <usize>(g0 * hd) << 1;
  const to = <usize>(g1 * hd) << 1;
  const vSection = <usize>B * slotBytes;
  let touched = 0;
  for (let t0 = 0, b = 0; t0 < len; t0 += B, b++) {
    const base = blockAt(table, b, layerOff);
    const m = min(B, len - t0);
    const ahead = b + 1 < nb ? blockAt(table, b + 1, layerOff) : 0;
    const mAhead = min(B, len - t0 - B);
    const perGroup = (sectionLines * 4 + B - 1) / B + 1;
    for (let s = 0, line = 0; s < m; s += 4) {
      if (ahead != 0 && whole) touched ^= touchLines(ahead, line, min(sectionLines, line + perGroup));
      else if (ahead == 0 && whole && nextFirst != 0) touched ^= touchLines(nextFirst + layerOff, line, min(sectionLines, line + perGroup));
      else if (ahead != 0) touched ^= touchSlots(ahead, s, min(s + 4, mAhead), slotBytes, from, to, vSection);
      line += perGroup;
      // As in streamScores: a short last group reads slots inside the block and stores nothing past `live`.
      const live = min(4, m - s);
      const k0 = base + <usize>s * slotBytes;
      const k1 = k0 + (live > 1 ? slotBytes : 0);
      const k2 = k0 + (live > 2 ? 2 * slotBytes : 0);
      const k3 = k0 + (live > 3 ? 3 * slotBytes : 0);
      for (let g = g0; g < g1; g++) {
        const ko = <usize>(g * hd) << 1;
        for (let hh = 0; hh < kvMul; hh++) {
          const h = g * kvMul + hh;
          const qo = <usize>(h * hd) << 2;
          let a0 = f32x4.splat(0);
          let a1 = a0;
          let a2 = a0;
          let a3 = a0;
          for (let i = 0; i < hd8; i += 8) {
            const x0 = ld(qx + qo, i);
            const x1 = ld(qx + qo, i + 4);
            const e = ko + (<usize>i << 1);
            let v = halves8(k0 + e);
            a0 = f32x4.add(f32x4.add(a0, f32x4.mul(x0, f16bitsLo(v))), f32x4.mul(x1, f16bitsHi(v)));
            v = halves8(k1 + e);
            a1 = f32x4.add(f32x4.add(a1, f32x4.mul(x0, f16bitsLo(v))), f32x4.mul(x1, f16bitsHi(v)));
            v = halves8(k2 + e);
            a2 = f32x4.add(f32x4.add(a2, f32x4.mul(x0, f16bitsLo(v))), f32x4.mul(x1, f16bitsHi(v)));
            v = halves8(k3 + e);
            a3 = f32x4.add(f32x4.add(a3, f32x4.mul(x0, f16bitsLo(v))), f32x4.mul(x1, f16bitsHi(v)));
          }
          const qp = q + qo;
          if (hd8 < hd4) {
            const x = ld(qp, hd8);
            a0 = f32x4.add(a0, f32x4.mul(x, kv4(k0 + ko, hd8)));
            a1 = f32x4.add(a1, f32x4.mul(x, kv4(k1 + ko, hd8)));
            a2 = f32x4.add(a2, f32x4.mul(x, kv4(k2 + ko, hd8)));
            a3 = f32x4.add(a3, f32x4.mul(x, kv4(k3 + ko, hd8)));
          }
          storeScores(att + <usize>h * attStep + (<usize>(t0 + s) << 2), live, a0, a1, a2, a3, qp, k0 + ko, k1 + ko, k2 + ko, k3 + ko, hd4, hd, sqrtHd);
        }
      }
    }
  }
  // Stored so the touching loads are not dead code (the scaled query is not read again).
  store<i32>(qx, touched);
}

/**
 * Loads one word of each 64-byte line l0 .. l1 from p (their xor, which nothing uses): the next
 * block's K and V, spread over this block's groups of four positions, so its lines are on their way from
 * memory while this block's scores are computed. WebAssembly has no prefetch, and the hardware's
 * stops at every block (the blocks lie anywhere in the slab) and every page: on K/V that has left
 * the caches (a batch's, behind a layer's weights) 1.27x, on K/V in cache 1.2x (8 sequences of
 * 140 positions, TinyStories heads).
 */
@inline function touchLines(p: usize, l0: i32, l1: i32): i32 {
  let x = 0;
  for (let l = l0; l < l1; l++) x ^= load<i32>(p + (<usize>l << 6));
  return x;
}

/**
 * touchLines for a piece of a few heads: one word of each line holding bytes from .. to of the
 * next block's slots s0 .. s1 in its K section at p and its V section vSection further.
 */
@inline function touchSlots(p: usize, s0: i32, s1: i32, slotBytes: usize, from: usize, to: usize, vSection: usize): i32 {
  let x = 0;
  for (let s = s0; s < s1; s++) {
    const a = p + <usize>s * slotBytes;
    for (let o = (a + from) & ~63; o < a + to; o += 64) x ^= load<i32>(o) ^ load<i32>(o + vSection);
  }
  return x;
}

/** The `live` of four positions' scores at `at`: each lane sum folded, its tail added, divided by sqrt(hd). */
@inline function storeScores(at: usize, live: i32, a0: v128, a1: v128, a2: v128, a3: v128, qp: usize, k0: usize, k1: usize, k2: usize, k3: usize, hd4: i32, hd: i32, sqrtHd: f32): void {
  store<f32>(at, scoreTail(fold(a0), qp, k0, hd4, hd) / sqrtHd);
  if (live > 1) store<f32>(at + 4, scoreTail(fold(a1), qp, k1, hd4, hd) / sqrtHd);
  if (live > 2) store<f32>(at + 8, scoreTail(fold(a2), qp, k2, hd4, hd) / sqrtHd);
  if (live > 3) store<f32>(at + 12, scoreTail(fold(a3), qp, k3, hd4, hd) / sqrtHd);
}

/** Row att[h][t] = q_h . k[t] / sqrt(hd) for the heads h of KV heads g0 .. g1 and t < len: four positions at a time. */
function streamScores(job: AttendJob, q: usize, att: usize, len: i32, g0: i32, g1: i32): void {
  const table = job.table;
  const layerOff = job.layerOff;
  const attStep = <usize>job.attStride << 2;
  const B = job.B;
  const nKv = job.nKv;
  const kvMul = job.kvMul;
  const hd = job.hd;
  const hd4 = hd & ~3;
  const sqrtHd = Mathf.sqrt(<f32>hd);
  const slotBytes = <usize>(nKv * hd) << 1;
  for (let t0 = 0, b = 0; t0 < len; t0 += B, b++) {
    const base = blockAt(table, b, layerOff);
    const m = min(B, len - t0);
    for (let s = 0; s < m; s += 4) {
      // The last group of a block may hold fewer than four positions: the extra sums read
      // slots of the block (inside it) and are never stored.
      const live = min(4, m - s);
      const k0 = base + <usize>s * slotBytes;
      const k1 = k0 + (live > 1 ? slotBytes : 0);
      const k2 = k0 + (live > 2 ? 2 * slotBytes : 0);
      const k3 = k0 + (live > 3 ? 3 * slotBytes : 0);
      for (let g = g0; g < g1; g++) {
        const ko = <usize>(g * hd) << 1;
        for (let hh = 0; hh < kvMul; hh++) {
          const h = g * kvMul + hh;
          const qp = q + (<usize>(h * hd) << 2);
          let a0 = f32x4.splat(0);
          let a1 = a0;
          let a2 = a0;
          let a3 = a0;
          let i = 0;
          for (; i + 8 <= hd4; i += 8) {
            a0 = dot8(a0, qp, k0 + ko, i);
            a1 = dot8(a1, qp, k1 + ko, i);
            a2 = dot8(a2, qp, k2 + ko, i);
            a3 = dot8(a3, qp, k3 + ko, i);
          }
          if (i < hd4) {
            const x = ld(qp, i);
            a0 = f32x4.add(a0, f32x4.mul(x, kv4(k0 + ko, i)));
            a1 = f32x4.add(a1, f32x4.mul(x, kv4(k1 + ko, i)));
            a2 = f32x4.add(a2, f32x4.mul(x, kv4(k2 + ko, i)));
            a3 = f32x4.add(a3, f32x4.mul(x, kv4(k3 + ko, i)));
          }
          storeScores(att + <usize>h * attStep + (<usize>(t0 + s) << 2), live, a0, a1, a2, a3, qp, k0 + ko, k1 + ko, k2 + ko, k3 + ko, hd4, hd, sqrtHd);
        }
      }
    }
  }
}

/**
 * out_h = sum over t < len of att[h][t] * v[t] for the heads h of KV heads g0 .. g1, summed in
 * out from +0 in t order, att scaled by 2^112 (softmaxScaled) against V's f16bits patterns (halves8):
 * each product the same real number as att * v. Four positions at a time go through each chunk
 * of out between its load and its store (the adds still one position after another).
 */
function streamValues(job: AttendJob, out: usize, att: usize, len: i32, g0: i32, g1: i32): void {
  const table = job.table;
  const vOff = vOffOf(job);
  const attStep = <usize>job.attStride << 2;
  const B = job.B;
  const nKv = job.nKv;
  const kvMul = job.kvMul;
  const hd = job.hd;
  const slotBytes = <usize>(nKv * hd) << 1;
  for (let h = g0 * kvMul; h < g1 * kvMul; h++) {
    const o = out + (<usize>(h * hd) << 2);
    for (let i = 0; i < hd; i++) store<f32>(o + (<usize>i << 2), 0);
  }
  for (let t0 = 0, b = 0; t0 < len; t0 += B, b++) {
    const p = blockAt(table, b, vOff);
    const m = min(B, len - t0);
    let s = 0;
    for (; s + 4 <= m; s += 4) {
      const vp = p + <usize>s * slotBytes;
      for (let g = g0; g < g1; g++) {
        for (let hh = 0; hh < kvMul; hh++) {
          const h = g * kvMul + hh;
          streamValues4(out + (<usize>(h * hd) << 2), att + <usize>h * attStep + (<usize>(t0 + s) << 2), vp + (<usize>(g * hd) << 1), slotBytes, hd);
        }
      }
    }
    for (; s < m; s++) {
      const vp = p + <usize>s * slotBytes;
      for (let g = g0; g < g1; g++) {
        for (let hh = 0; hh < kvMul; hh++) {
          const h = g * kvMul + hh;
          streamValues1(out + (<usize>(h * hd) << 2), att + <usize>h * attStep + (<usize>(t0 + s) << 2), vp + (<usize>(g * hd) << 1), hd);
        }
      }
    }
  }
}

/** o[i] += a'[u] * v_u[i] for the four positions u = 0..3 in order (a' at ap, v_u at vp + u * slotBytes), every i < hd. */
@inline function streamValues4(o: usize, ap: usize, vp: usize, slotBytes: usize, hd: i32): void {
  const hd4 = hd & ~3;
  const hd8 = hd & ~7;
  const c0 = v128.load32_splat(ap);
  const c1 = v128.load32_splat(ap, 4);
  const c2 = v128.load32_splat(ap, 8);
  const c3 = v128.load32_splat(ap, 12);
  const v1 = vp + slotBytes;
  const v2 = v1 + slotBytes;
  const v3 = v2 + slotBytes;
  for (let i = 0; i < hd8; i += 8) {
    const e = <usize>i << 1;
    let lo = ld(o, i);
    let hi = ld(o, i + 4);
    let v = halves8(vp + e);
    lo = f32x4.add(lo, f32x4.mul(c0, f16bitsLo(v)));
    hi = f32x4.add(hi, f32x4.mul(c0, f16bitsHi(v)));
    v = halves8(v1 + e);
    lo = f32x4.add(lo, f32x4.mul(c1, f16bitsLo(v)));
    hi = f32x4.add(hi, f32x4.mul(c1, f16bitsHi(v)));
    v = halves8(v2 + e);
    lo = f32x4.add(lo, f32x4.mul(c2, f16bitsLo(v)));
    hi = f32x4.add(hi, f32x4.mul(c2, f16bitsHi(v)));
    v = halves8(v3 + e);
    lo = f32x4.add(lo, f32x4.mul(c3, f16bitsLo(v)));
    hi = f32x4.add(hi, f32x4.mul(c3, f16bitsHi(v)));
    v128.store(o + (<usize>i << 2), lo);
    v128.store(o + (<usize>i << 2), hi, 16);
  }
  if (hd8 < hd4) {
    let a = ld(o, hd8);
    a = f32x4.add(a, f32x4.mul(c0, kv4bits(vp, hd8)));
    a = f32x4.add(a, f32x4.mul(c1, kv4bits(v1, hd8)));
    a = f32x4.add(a, f32x4.mul(c2, kv4bits(v2, hd8)));
    a = f32x4.add(a, f32x4.mul(c3, kv4bits(v3, hd8)));
    v128.store(o + (<usize>hd8 << 2), a);
  }
  for (let i = hd4; i < hd; i++) {
    const e = <usize>i << 1;
    let a = load<f32>(o + (<usize>i << 2));
    a += load<f32>(ap) * f16bits1(<u32>load<u16>(vp + e));
    a += load<f32>(ap, 4) * f16bits1(<u32>load<u16>(v1 + e));
    a += load<f32>(ap, 8) * f16bits1(<u32>load<u16>(v2 + e));
    a += load<f32>(ap, 12) * f16bits1(<u32>load<u16>(v3 + e));
    store<f32>(o + (<usize>i << 2), a);
  }
}

/** o[i] += a' * v[i] for one position (a' at ap, v at vp), every i < hd. */
@inline function streamValues1(o: usize, ap: usize, vp: usize, hd: i32): void {
  const hd4 = hd & ~3;
  const hd8 = hd & ~7;
  const c = v128.load32_splat(ap);
  for (let i = 0; i < hd8; i += 8) {
    const v = halves8(vp + (<usize>i << 1));
    v128.store(o + (<usize>i << 2), f32x4.add(ld(o, i), f32x4.mul(c, f16bitsLo(v))));
    v128.store(o + (<usize>i << 2), f32x4.add(ld(o, i + 4), f32x4.mul(c, f16bitsHi(v))), 16);
  }
  if (hd8 < hd4) v128.store(o + (<usize>hd8 << 2), f32x4.add(ld(o, hd8), f32x4.mul(c, kv4bits(vp, hd8))));
  const a = load<f32>(ap);
  for (let i = hd4; i < hd; i++) store<f32>(o + (<usize>i << 2), load<f32>(o + (<usize>i << 2)) + a * f16bits1(<u32>load<u16>(vp + (<usize>i << 1))));
}

/** Four f16 at p + 2i as f16bits' patterns (kv4 without its rebias). */
@inline function kv4bits(p: usize, i: i32): v128 {
  return topBits(top16x4(p + (<usize>i << 1)));
}

/**
 * Rows j < nr of one sequence (row j at position firstPos + j) attend with KV head g's queries
 * over the blocks of `table` (see the top), when they are at least four (a prefill). att is
 * scratch of 4 * attStride floats, attStride >= firstPos + nr; lin of 2 * attStride * hd floats.
 * Each output depends only on its query and the cache, so computing heads apart (on any thread)
 * never changes a bit.
 */
function attendHead(job: AttendJob, g: i32): void {
  const out = job.out;
  const q = job.q;
  const table = job.table;
  const att = job.att;
  const firstPos = job.firstPos;
  const B = job.B;
  const kvMul = job.kvMul;
  const hd = job.hd;
  const qStride = job.qStride;
  const kvDim = job.nKv * hd;
  const attStep = <usize>job.attStride << 2;
  const nq = job.nr * kvMul;
  const n = firstPos + job.nr;
  const off = g * hd;
  // Query c of this KV head: row c / kvMul, head g * kvMul + c % kvMul.
  linearize(job.lin, table, job.layerOff, n, B, kvDim, off, hd);
  linearize(vLinOf(job), table, vOffOf(job), n, B, kvDim, off, hd);
  // Four at a time; a last short tile repeats its last query, which only writes its own
  // result again.
  for (let c = 0; c < nq; c += 4) {
    const c1 = min(c + 1, nq - 1);
    const c2 = min(c + 2, nq - 1);
    const c3 = min(c + 3, nq - 1);
    const o0 = queryAt(c, kvMul, g, hd, qStride);
    const o1 = queryAt(c1, kvMul, g, hd, qStride);
    const o2 = queryAt(c2, kvMul, g, hd, qStride);
    const o3 = queryAt(c3, kvMul, g, hd, qStride);
    const len0 = firstPos + c / kvMul + 1;
    const len1 = firstPos + c1 / kvMul + 1;
    const len2 = firstPos + c2 / kvMul + 1;
    const len3 = firstPos + c3 / kvMul + 1;
    scores4(job, q + o0, q + o1, q + o2, q + o3, len3);
    softmax(att, len0);
    softmax(att + attStep, len1);
    softmax(att + 2 * attStep, len2);
    softmax(att + 3 * attStep, len3);
    values4(job, out + o0, out + o1, out + o2, out + o3, len0, len1, len2, len3);
  }
}

/** KV heads g0 .. g1 of the job's sequence: streamed when it has fewer than four queries per KV head (decode), else one by one. */
function attendPiece(job: AttendJob, g0: i32, g1: i32): void {
  if (job.nr * job.kvMul < 4) attendStream(job, g0, g1);
  else for (let g = g0; g < g1; g++) attendHead(job, g);
}

/** Every head of one sequence, the AttendJob at `job` (its att of 4 * nKv * attStride floats). */
export function attend(job: usize): void {
  nextFirst = 0;
  const j = changetype<AttendJob>(job);
  attendPiece(j, 0, j.nKv);
}

// An attention dispatch's parameters, in i32 slots at `params` (Transformer writes them): the
// shared ones, then ATT_SEQ_INTS per sequence. Piece c of the dispatch is the triple at
// pieces + 12c: a sequence and its KV heads g0 .. g1, streamed together when the sequence has
// fewer than four queries per KV head (decode), else one by one.
const A_PIECES = 0;
const A_B = 1;
const A_NKV = 2;
const A_KVMUL = 3;
const A_HD = 4;
const A_QSTRIDE = 5;
const A_LAYEROFF = 6;
const A_ATTSTRIDE = 7;
/** How many pieces the dispatch has (so a piece knows whether another follows it). */
const A_NPIECES = 8;
const A_SEQS = 9;
/** Per sequence: out, q, table (byte addresses), firstPos, rows. */
const ATT_SEQ_INTS = 5;

/**
 * Pieces c0 .. c1 of the attention dispatch at params, on this thread. scratch (thread-private)
 * holds the AttendJob this thread fills for each piece, then att (4 * attStride floats) then lin
 * (2 * attStride * hd floats), or att of 4 * nKv * attStride floats for a streamed piece.
 */
export function attend_jobs(params: usize, c0: i32, c1: i32, scratch: usize): void {
  const job = changetype<AttendJob>(scratch);
  job.layerOff = <usize>load<i32>(params + (A_LAYEROFF << 2));
  job.att = scratch + ATTEND_JOB_BYTES;
  job.attStride = load<i32>(params + (A_ATTSTRIDE << 2));
  job.lin = job.att + (<usize>job.attStride << 4);
  job.B = load<i32>(params + (A_B << 2));
  job.nKv = load<i32>(params + (A_NKV << 2));
  job.kvMul = load<i32>(params + (A_KVMUL << 2));
  job.hd = load<i32>(params + (A_HD << 2));
  job.qStride = load<i32>(params + (A_QSTRIDE << 2));
  const pieces = <usize>load<i32>(params + (A_PIECES << 2));
  for (let c = c0; c < c1; c++) {
    const pc = pieces + <usize>c * 12;
    const s = load<i32>(pc);
    const p = params + (<usize>(A_SEQS + s * ATT_SEQ_INTS) << 2);
    job.out = <usize>load<i32>(p);
    job.q = <usize>load<i32>(p, 4);
    job.table = <usize>load<i32>(p, 8);
    job.firstPos = load<i32>(p, 12);
    job.nr = load<i32>(p, 16);
    nextFirst = 0;
    if (c + 1 < load<i32>(params + (A_NPIECES << 2))) {
      const sn = load<i32>(pc, 12);
      if (sn != s) nextFirst = <usize>load<i32>(<usize>load<i32>(params + (<usize>(A_SEQS + sn * ATT_SEQ_INTS) << 2), 8));
    }
    attendPiece(job, load<i32>(pc, 4), load<i32>(pc, 8));
  }
  nextFirst = 0;
}

/** Byte offset of query c of KV head g in q (and of its output in out). */
@inline function queryAt(c: i32, kvMul: i32, g: i32, hd: i32, qStride: i32): usize {
  const j = c / kvMul;
  return (<usize>j * <usize>qStride + <usize>((g * kvMul + c - j * kvMul) * hd)) << 2;
}
