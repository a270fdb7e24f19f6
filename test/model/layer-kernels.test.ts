import { describe, expect, test } from "bun:test";
import { expF32, swigluF32 } from "../../src/model/compute/f32-math.ts";
import { ATTEND_JOB } from "../../src/model/compute/kernel-exports.ts";
import { MatmulKernel } from "../../src/model/compute/matmul.ts";
import { bits } from "./helpers.ts";

// The attention and elementwise kernels against plain JS written in the same order, bit for bit.
const mk = new MatmulKernel();
const ex = mk.exports!;

/** f32 values whose bit patterns come from a seeded LCG (every kind: NaN, inf, subnormal...). */
function randomBits(n: number, seed: number): Float32Array {
  const u = new Uint32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    u[i] = s;
  }
  return new Float32Array(u.buffer);
}

function f32(values: ArrayLike<number>): Float32Array {
  const a = mk.alloc(values.length);
  a.set(values);
  return a;
}

describe("f32 -> f16 (K/V into the cache)", () => {
  test("to f16 rounds as float16array", () => {
    // Every f16 value, its f32 neighbours, and the midpoints to the next value and theirs: every
    // rounding boundary, ties included; then random patterns and the edges.
    const edges: number[] = [0, -0, Infinity, -Infinity, NaN, 65504, 65519.996, 65520, 65536, 1e9, 2 ** -24, 2 ** -25, 2 ** -26, 3 * 2 ** -26];
    const one = new Float32Array(1);
    const oneBits = new Uint32Array(one.buffer);
    const near = (x: number): number[] => {
      one[0] = x;
      const b = oneBits[0]!;
      const out: number[] = [];
      for (const d of [-1, 0, 1]) {
        oneBits[0] = b + d;
        out.push(one[0]!);
      }
      return out;
    };
    const h = new Uint16Array(1);
    const hv = new Float16Array(h.buffer);
    const vals: number[] = [...edges];
    for (let i = 0; i < 0x7c00; i += 1) {
      h[0] = i;
      const a = hv[0]!;
      h[0] = i + 1;
      const b = hv[0]!;
      for (const x of [...near(a), ...near((a + b) / 2)]) vals.push(x, -x);
    }
    const all = new Float32Array(vals.length + 200000);
    all.set(vals);
    all.set(randomBits(200000, 5), vals.length);
    const src = f32(all);
    const dst = mk.allocBytes(all.length * 2)!;
    ex.to_f16(mk.addressOf(dst), mk.addressOf(src), all.length);
    const got = new Uint16Array(dst.buffer, dst.byteOffset, all.length);
    // Element by element, as the slab is written without the kernel (a whole-array copy would keep a NaN's sign).
    const wantHalf = new Float16Array(all.length);
    for (let i = 0; i < all.length; i++) wantHalf[i] = all[i]!;
    const want = new Uint16Array(wantHalf.buffer);
    let bad = 0;
    for (let i = 0; i < all.length && bad < 5; i++) {
      if (got[i] !== want[i]) {
        bad++;
        expect(`${all[i]}: 0x${got[i]!.toString(16)}`).toBe(`${all[i]}: 0x${want[i]!.toString(16)}`);
      }
    }
    expect(bad).toBe(0);
    // Every length 1..19 from odd offsets: the eight-wide body, the four-wide step and the tail,
    // each leaving the halves past n alone.
    for (let n = 1; n <= 19; n++) {
      const part = mk.allocBytes(2 * (n + 1))!;
      const at = 8 * n + 3;
      ex.to_f16(mk.addressOf(part), mk.addressOf(src) + 4 * at, n);
      const half = new Uint16Array(part.buffer, part.byteOffset, n + 1);
      expect([n, Array.from(half)]).toEqual([n, [...Array.from(want.subarray(at, at + n)), 0]]);
    }
  });
});

describe("rmsnorm", () => {
  test("rmsnorm kernel equals js of the same order for every row count", () => {
    // Rows go four at a time (two f64x2 chains), then two, then one, and each row's elements four
    // at a time, then its tail: every count 1..9 and widths with and without a tail against JS in
    // f64 with one rounding to f32 (transformer.ts's fallback), rows of very different scales so
    // a row normed with another's sum shows, and the norm weights read from an offset.
    const eps = 1e-5;
    for (const dim of [36, 37, 288]) {
      const gOff = 5;
      const g = f32(Array.from({ length: gOff + dim }, (_, i) => 1 + Math.sin(i) * 0.5));
      const gAt = g.subarray(gOff);
      for (let rows = 1; rows <= 9; rows++) {
        // Within a row, magnitudes from 2^-12 to 2^12 (a sum with rounding at every add).
        const xv = Array.from({ length: rows * dim }, (_, i) => Math.cos(i * 0.71) * 10 ** ((Math.floor(i / dim) % 5) - 2) * 2 ** (((i * 7) % 25) - 12));
        const x = f32(xv);
        const o = mk.alloc(rows * dim);
        ex.rmsnorm(mk.addressOf(o), mk.addressOf(x), mk.addressOf(gAt), rows, dim, eps);
        const want = new Float32Array(rows * dim);
        for (let r = 0; r < rows; r++) {
          let ss = 0;
          for (let i = 0; i < dim; i++) ss += x[r * dim + i]! * x[r * dim + i]!;
          const inv = 1 / Math.sqrt(ss / dim + eps);
          for (let i = 0; i < dim; i++) want[r * dim + i] = gAt[i]! * (inv * x[r * dim + i]!);
        }
        expect([dim, rows, bits(o)]).toEqual([dim, rows, bits(want)]);
      }
    }
  });
});

describe("rope", () => {
  test("rope kernel equals js of the same order for every row count and head size", () => {
    // Heads of hd % 4 == 0 go two pairs at a time in f64x2, others a pair at a time: both against
    // transformer.ts's JS (f64 a c - b s, a s + b c, one rounding to f32), rows 1..9 at scattered
    // positions, q wider than k (grouped heads).
    for (const hd of [4, 6, 8, 10, 48]) {
      const half = hd / 2;
      const maxPos = 40;
      const cos = mk.allocF64(maxPos * half);
      const sin = mk.allocF64(maxPos * half);
      for (let p = 0; p < maxPos; p++) {
        for (let i = 0; i < half; i++) {
          cos[p * half + i] = Math.cos(p / 10000 ** ((2 * i) / hd));
          sin[p * half + i] = Math.sin(p / 10000 ** ((2 * i) / hd));
        }
      }
      const qDim = 3 * hd;
      const kvDim = hd;
      for (let rows = 1; rows <= 9; rows++) {
        const pos = mk.allocInts(rows);
        for (let r = 0; r < rows; r++) pos[r] = (r * 17 + hd) % maxPos;
        const q = f32(Array.from({ length: rows * qDim }, (_, i) => Math.sin(i * 1.3) * 2 ** ((i % 9) - 4)));
        const k = f32(Array.from({ length: rows * kvDim }, (_, i) => Math.cos(i * 0.7) * 2 ** ((i % 7) - 3)));
        const turn = (v: Float32Array, n: number): Float32Array => {
          const o = Float32Array.from(v);
          for (let r = 0; r < rows; r++) {
            for (let i = 0; i < n; i += 2) {
              const t = pos[r]! * half + ((i % hd) >> 1);
              const a = o[r * n + i]!;
              const b = o[r * n + i + 1]!;
              o[r * n + i] = a * cos[t]! - b * sin[t]!;
              o[r * n + i + 1] = a * sin[t]! + b * cos[t]!;
            }
          }
          return o;
        };
        const wantQ = turn(q, qDim);
        const wantK = turn(k, kvDim);
        ex.rope(mk.addressOf(q), mk.addressOf(k), mk.addressOf(pos), mk.addressOf(cos), mk.addressOf(sin), rows, qDim, kvDim, hd);
        expect([hd, rows, bits(q), bits(k)]).toEqual([hd, rows, bits(wantQ), bits(wantK)]);
      }
    }
  });
});

describe("exp and swiglu", () => {
  test("swiglu kernel equals js of the same order", () => {
    // a over the whole range exp sees (both clamps, NaN, inf), by a sweep and random patterns; an
    // odd length for the scalar tail.
    const n = 300001;
    const a = new Float32Array(n);
    for (let i = 0; i < 200000; i++) a[i] = -100 + i * 0.001;
    a.set(randomBits(n - 200000, 9), 200000);
    a.set([0, -0, Infinity, -Infinity, NaN, 87, -87, 88, -88, 86.99999, 88.00001], 0);
    const b = new Float32Array(n).map((_, i) => Math.cos(i) * 3);
    const h = f32(a);
    const g = f32(b);
    ex.swiglu(mk.addressOf(h), mk.addressOf(g), n);
    const want = a.slice();
    swigluF32(want, b, n);
    const gb = bits(h);
    const wb = bits(want);
    for (let i = 0; i < n; i++) {
      // NaNs may differ in payload only: JS canonicalizes them.
      if (gb[i] !== wb[i] && !(Number.isNaN(h[i]!) && Number.isNaN(want[i]!))) expect(`${a[i]}, ${b[i]}: ${h[i]}`).toBe(`${a[i]}, ${b[i]}: ${want[i]}`);
    }
  });

  test("swiglu over the threads gives the bits of one thread, however it is cut", async () => {
    const two = new MatmulKernel([], { threads: 2 });
    await two.ready();
    const before = two.splitCalls;
    // Below the split, at it with an odd tail, an 8B decode batch's, and a prefill's.
    for (const n of [1000, (1 << 15) + 3, 8 * 14336, 64 * 8192 + 5]) {
      const a = randomBits(n, n).map((x) => (Number.isFinite(x) ? Math.max(-90, Math.min(90, x)) : x));
      const b = new Float32Array(n).map((_, i) => Math.sin(i) * 2);
      const one = f32(a);
      ex.swiglu(mk.addressOf(one), mk.addressOf(f32(b)), n);
      const h = two.alloc(n);
      h.set(a);
      const g = two.alloc(n);
      g.set(b);
      two.swiglu(h, g, n);
      expect([n, bits(h)]).toEqual([n, bits(one)]);
    }
    expect(two.splitCalls).toBeGreaterThan(before);
    two.close();
  });

  test("exp is within three ulp and clamps", () => {
    const ulp = (x: number) => {
      const a = new Float32Array([x]);
      const u = new Uint32Array(a.buffer);
      u[0]! += 1;
      return a[0]! - x;
    };
    let worst = 0;
    for (let x = -87; x <= 88; x += 0.0137) {
      const xf = Math.fround(x);
      const want = Math.exp(xf);
      worst = Math.max(worst, Math.abs(expF32(xf) - want) / ulp(Math.fround(want)));
    }
    expect(worst).toBeLessThanOrEqual(3);
    expect([expF32(0), expF32(-0), expF32(89), expF32(-88), expF32(Infinity), expF32(-Infinity)]).toEqual([1, 1, Infinity, 0, Infinity, 0]);
    expect(expF32(NaN)).toBeNaN();
  });

  test("add into is one f32 add", () => {
    const a = randomBits(1001, 3);
    const b = randomBits(1001, 4);
    const x = f32(a);
    ex.add_into(mk.addressOf(x), mk.addressOf(f32(b)), 1001);
    const want = a.slice();
    for (let i = 0; i < 1001; i++) want[i]! += b[i]!;
    for (let i = 0; i < 1001; i++) if (!Number.isNaN(want[i]!)) expect(bits(x.subarray(i, i + 1))).toEqual(bits(want.subarray(i, i + 1)));
  });
});

/**
 * attend's order in plain JS: per query, scores as four lanes by i mod 4 folded (s0 + s1) +
 * (s2 + s3) then the tail, over sqrt(hd); softmax's max, expF32, the sum in that order too, a divide; each
 * output a sum over t in order from +0.
 */
function attendRef(
  q: Float32Array,
  kv: Uint16Array,
  firstPos: number,
  nr: number,
  B: number,
  blockElems: number,
  nKv: number,
  kvMul: number,
  hd: number,
  qStride: number,
): Float32Array {
  const f = Math.fround;
  const lut = new Float32Array(new Float16Array(Uint16Array.from({ length: 65536 }, (_, i) => i).buffer));
  const kvDim = nKv * hd;
  const at = (t: number, off: number) => Math.floor(t / B) * blockElems + (t % B) * kvDim + off;
  const vOff = B * kvDim;
  const out = new Float32Array(nr * qStride);
  const sqrtHd = f(Math.sqrt(hd));
  const hd4 = hd - (hd % 4);
  for (let j = 0; j < nr; j++) {
    const len = firstPos + j + 1;
    for (let head = 0; head < nKv * kvMul; head++) {
      const g = Math.floor(head / kvMul);
      const qo = j * qStride + head * hd;
      const att = new Float32Array(len);
      for (let t = 0; t < len; t++) {
        const k = at(t, g * hd);
        const s = [0, 0, 0, 0];
        for (let i = 0; i < hd4; i++) s[i % 4] = f(s[i % 4]! + f(q[qo + i]! * lut[kv[k + i]!]!));
        let sc = f(f(s[0]! + s[1]!) + f(s[2]! + s[3]!));
        for (let i = hd4; i < hd; i++) sc = f(sc + f(q[qo + i]! * lut[kv[k + i]!]!));
        att[t] = f(sc / sqrtHd);
      }
      let max = -Infinity;
      for (let t = 0; t < len; t++) max = Math.max(max, att[t]!);
      const len4 = len - (len % 4);
      const e = [0, 0, 0, 0];
      for (let t = 0; t < len; t++) att[t] = expF32(f(att[t]! - max));
      for (let t = 0; t < len4; t++) e[t % 4] = f(e[t % 4]! + att[t]!);
      let sum = f(f(e[0]! + e[1]!) + f(e[2]! + e[3]!));
      for (let t = len4; t < len; t++) sum = f(sum + att[t]!);
      for (let t = 0; t < len; t++) att[t] = f(att[t]! / sum);
      for (let i = 0; i < hd; i++) {
        let o = 0;
        for (let t = 0; t < len; t++) o = f(o + f(att[t]! * lut[kv[at(t, g * hd) + vOff + i]!]!));
        out[qo + i] = o;
      }
    }
  }
  return out;
}

/**
 * One attend call against attendRef: blocks of B scattered in reverse order behind a spare one,
 * found through the table; att and lin as small as attend allows unless `attStride` is given.
 * `edit` changes the query first (its values, or one huge element).
 */
function checkAttend(
  nKv: number,
  kvMul: number,
  hd: number,
  firstPos: number,
  nr: number,
  B: number,
  seed: number,
  attStride?: number,
  edit?: (q: Float32Array) => void,
): void {
  const kvDim = nKv * hd;
  const qStride = nKv * kvMul * hd + 3; // rows further apart than their heads
  const n = firstPos + nr;
  const nb = Math.ceil(n / B);
  const blockElems = 2 * B * kvDim;
  const kvVals = new Float16Array(nb * blockElems).map((_, i) => Math.sin(i * 0.731 + seed) * 2);
  const kvBits = new Uint16Array(kvVals.buffer);
  const qv = new Float32Array(nr * qStride).map((_, i) => Math.cos(i * 0.377 + seed) * 1.5);
  edit?.(qv);
  const kvMem = mk.allocBytes(kvBits.byteLength + blockElems * 2)!;
  const table = mk.allocInts(nb);
  for (let b = 0; b < nb; b++) {
    const at = (nb - b) * blockElems * 2;
    kvMem.set(new Uint8Array(kvBits.buffer, b * blockElems * 2, blockElems * 2), at);
    table[b] = mk.addressOf(kvMem) + at;
  }
  const q = f32(qv);
  const out = mk.alloc(nr * qStride);
  const stride = attStride ?? (n + 3) & ~3;
  const att = mk.alloc(4 * nKv * stride);
  const lin = mk.alloc(2 * stride * hd);
  const job = mk.allocInts(Object.keys(ATTEND_JOB).length);
  const fields: Record<keyof typeof ATTEND_JOB, number> = {
    out: mk.addressOf(out),
    q: mk.addressOf(q),
    table: mk.addressOf(table),
    layerOff: 0,
    att: mk.addressOf(att),
    attStride: stride,
    lin: mk.addressOf(lin),
    firstPos,
    nr,
    B,
    nKv,
    kvMul,
    hd,
    qStride,
  };
  for (const [k, slot] of Object.entries(ATTEND_JOB)) job[slot] = fields[k as keyof typeof ATTEND_JOB];
  ex.attend(mk.addressOf(job));
  const want = attendRef(qv, kvBits, firstPos, nr, B, blockElems, nKv, kvMul, hd, qStride);
  for (let j = 0; j < nr; j++) {
    const row = (a: Float32Array) => bits(a.subarray(j * qStride, j * qStride + nKv * kvMul * hd));
    expect(`${nKv}x${kvMul}x${hd} pos ${firstPos}+${j}: ${row(out).join(",")}`).toBe(`${nKv}x${kvMul}x${hd} pos ${firstPos}+${j}: ${row(want).join(",")}`);
  }
}

describe("attention kernel", () => {
  test("attend equals js of the same order", () => {
    // MHA, GQA by 2, 3 and 4, MQA; head dims with and without a tail; prefill tiles of every
    // remainder, from the start and after a cached prefix.
    const shapes = [
      { nKv: 3, kvMul: 1, hd: 16 },
      { nKv: 2, kvMul: 2, hd: 8 },
      { nKv: 1, kvMul: 3, hd: 10 },
      { nKv: 2, kvMul: 4, hd: 6 },
      { nKv: 1, kvMul: 6, hd: 48 },
    ];
    let seed = 1;
    for (const { nKv, kvMul, hd } of shapes) {
      for (const [firstPos, nr] of [
        [0, 1],
        [0, 9],
        [5, 1],
        [5, 7],
        [17, 4],
        [2, 13],
      ] as const) {
        checkAttend(nKv, kvMul, hd, firstPos, nr, 4, seed++);
      }
    }
  });

  test("decode attention on the scaled query and its fallback equal js", () => {
    // Streamed decode (fewer than four queries per KV head) with room for the query scaled by
    // 2^112: head dims of whole eights, of a last four, with a tail; lengths that leave 1..3
    // positions past the fours of a block; a query element of 2^16 or more takes the
    // unscaled path for its row.
    const shapes = [
      { nKv: 6, kvMul: 1, hd: 48 },
      { nKv: 2, kvMul: 1, hd: 12 },
      { nKv: 2, kvMul: 3, hd: 10 },
      { nKv: 1, kvMul: 2, hd: 7 },
    ];
    const edits: [string, ((q: Float32Array) => void) | undefined][] = [
      ["as is", undefined],
      ["one huge element", (q) => (q[1] = 70000)],
      ["tiny values", (q) => q.forEach((v, i) => (q[i] = v * 1e-40))],
    ];
    let seed = 100;
    for (const { nKv, kvMul, hd } of shapes) {
      for (const [firstPos, nr] of [
        [0, 1],
        [16, 1],
        [37, 1],
        [61, 2],
        [62, 3],
      ] as const) {
        if (nr * kvMul >= 4) continue;
        for (const [, edit] of edits) checkAttend(nKv, kvMul, hd, firstPos, nr, 16, seed++, 72, edit);
      }
    }
  });
});
