/**
 * The bytes of a small WebAssembly SIMD module, assembled here so no wat2wasm is needed.
 *
 * It imports its memory as env.mem and exports
 *   matmul(y, x, w, rows, n, d)   (byte offsets into the memory; counts in floats)
 * with y[r*d + i] = dot(w row i, x row r), every dot in the order below.
 */

// The order every output is summed in (see matmulRef in matmul.ts, which spells it out in JS):
// f32x4 lane sums over j = l (mod 4) for j < n - n % 4, each `s + w * x` rounded to f32 after the
// product and after the sum (WebAssembly never fuses them), then (s0 + s1) + (s2 + s3), then the
// n % 4 tail one by one. Nothing in it depends on the row count or on which tile computes it.

// Opcodes (core and 0xfd-prefixed SIMD) used below.
const I32 = 0x7f,
  F32 = 0x7d,
  V128 = 0x7b;
const BLOCK = 0x02,
  LOOP = 0x03,
  END = 0x0b,
  BR = 0x0c,
  BR_IF = 0x0d,
  CALL = 0x10,
  VOID = 0x40;
const DROP = 0x1a,
  GET = 0x20,
  SET = 0x21;
const F32_LOAD = 0x2a,
  F32_STORE = 0x38;
const I32_CONST = 0x41,
  I32_NE = 0x47,
  I32_GE_U = 0x4f,
  I32_GT_U = 0x4b,
  I32_ADD = 0x6a,
  I32_MUL = 0x6c,
  I32_AND = 0x71,
  I32_SHL = 0x74;
const F32_ADD = 0x92,
  F32_MUL = 0x94;
const SIMD = 0xfd,
  V128_LOAD = 0x00,
  V128_CONST = 0x0c,
  F32X4_EXTRACT = 0x1f,
  F32X4_ADD = 0xe4,
  F32X4_MUL = 0xe6;

type Code = (number | Code)[];

function uleb(v: number): number[] {
  const out: number[] = [];
  do {
    let b = v & 0x7f;
    v >>>= 7;
    if (v !== 0) b |= 0x80;
    out.push(b);
  } while (v !== 0);
  return out;
}

function sleb(v: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = v & 0x7f;
    v >>= 7;
    if ((v === 0 && (b & 0x40) === 0) || (v === -1 && (b & 0x40) !== 0)) return [...out, b];
    out.push(b | 0x80);
  }
}

const flat = (c: Code): number[] => c.flatMap((e) => (typeof e === "number" ? [e] : flat(e)));
const simd = (op: number): number[] => [SIMD, ...uleb(op)];
const get = (l: number): Code => [GET, ...uleb(l)];
const set = (l: number): Code => [SET, ...uleb(l)];
const i32 = (v: number): Code => [I32_CONST, ...sleb(v)];
/** Unaligned-hint (align 2^2) loads at offset 0: rows of odd length start anywhere. */
const vload = (addr: Code): Code => [addr, simd(V128_LOAD), 2, 0];
const fload = (addr: Code): Code => [addr, F32_LOAD, 2, 0];
const add = (a: Code, b: Code): Code => [a, b, I32_ADD];
const mul = (a: Code, b: Code): Code => [a, b, I32_MUL];
/** `while (!exit) body`, tested before each pass; `exit` leaves an i32 on the stack. */
const whileNot = (exit: Code, body: Code): Code => [BLOCK, VOID, LOOP, VOID, exit, BR_IF, 1, body, BR, 0, END, END];

// Function indices.
const FIN = 0;
const strips: [number, number][] = [
  [8, 1],
  [4, 2],
  [4, 1],
  [1, 1],
];
const stripIndex = (wr: number, xr: number): number => 1 + strips.findIndex(([a, b]) => a === wr && b === xr);
const MATMUL = 1 + strips.length;

/**
 * fin(acc: v128, wp, xp, j, end: i32) -> f32: folds the lane sums and adds the tail
 * j .. end (byte offsets into rows wp and xp).
 */
function finBody(): Code {
  const [ACC, WP, XP, J, END_, S] = [0, 1, 2, 3, 4, 5];
  const lane = (l: number): Code => [get(ACC), simd(F32X4_EXTRACT), l];
  return [
    1,
    1,
    F32, // one local: s
    [lane(0), lane(1), F32_ADD, lane(2), lane(3), F32_ADD, F32_ADD, set(S)],
    whileNot(
      [get(J), get(END_), I32_GE_U],
      [get(S), fload(add(get(WP), get(J))), fload(add(get(XP), get(J))), F32_MUL, F32_ADD, set(S), add(get(J), i32(4)), set(J)],
    ),
    get(S),
    END,
  ];
}

/**
 * strip(y, x, w, n, d, i, r, rEnd) -> r': weight rows i .. i+WR-1 against token rows r, r+XR, ...
 * while a whole tile of XR rows fits before rEnd; returns the first row not done. The tile only
 * decides which outputs share the loads, never the order inside one.
 */
function stripBody(WR: number, XR: number): Code {
  const [Y, X, W, N, D, I, R, REND] = [0, 1, 2, 3, 4, 5, 6, 7];
  let next = 8;
  const NB = next++,
    N4B = next++,
    J = next++;
  const wrow = Array.from({ length: WR }, () => next++);
  const xrow = Array.from({ length: XR }, () => next++);
  const nI32 = next - 8;
  const acc = Array.from({ length: WR * XR }, () => next++);
  const xv = Array.from({ length: XR }, () => next++);
  const U = next++;
  const nV = next - 8 - nI32;
  const zero: Code = [simd(V128_CONST), new Array(16).fill(0)];
  const perTile: Code = [
    xrow.map((l, t): Code => [add(get(X), mul(add(get(R), i32(t)), get(NB))), set(l)]),
    acc.map((l): Code => [zero, set(l)]),
    i32(0),
    set(J),
    whileNot(
      [get(J), get(N4B), I32_GE_U],
      [
        xv.map((l, t): Code => [vload(add(get(xrow[t]!), get(J))), set(l)]),
        wrow.map(
          (wl, a): Code => [
            vload(add(get(wl), get(J))),
            set(U),
            xv.map((xl, t): Code => {
              const al = acc[a * XR + t]!;
              return [get(al), get(U), get(xl), simd(F32X4_MUL), simd(F32X4_ADD), set(al)];
            }),
          ],
        ),
        add(get(J), i32(16)),
        set(J),
      ],
    ),
    wrow.map(
      (wl, a): Code =>
        xrow.map(
          (xl, t): Code => [
            // &y[(r + t) * d + i + a]
            add(get(Y), [mul(add(get(R), i32(t)), get(D)), get(I), I32_ADD, i32(a), I32_ADD, i32(2), I32_SHL]),
            get(acc[a * XR + t]!),
            get(wl),
            get(xl),
            get(N4B),
            get(NB),
            CALL,
            ...uleb(FIN),
            F32_STORE,
            2,
            0,
          ],
        ),
    ),
    add(get(R), i32(XR)),
    set(R),
  ];
  return [
    2,
    ...uleb(nI32),
    I32,
    ...uleb(nV),
    V128,
    [get(N), i32(2), I32_SHL, set(NB)],
    [get(N), i32(-4), I32_AND, i32(2), I32_SHL, set(N4B)],
    wrow.map((l, a): Code => [add(get(W), mul(add(get(I), i32(a)), get(NB))), set(l)]),
    whileNot([add(get(R), i32(XR)), get(REND), I32_GT_U], perTile),
    get(R),
    END,
  ];
}

/**
 * matmul(y, x, w, rows, n, d): a single token row takes 8 weight rows at a time (more
 * independent sums in flight); more rows take 4 weight rows by 2 tokens, then the odd token;
 * weight rows left over go one by one.
 */
function matmulBody(): Code {
  const [Y, X, W, ROWS, N, D, I, R] = [0, 1, 2, 3, 4, 5, 6, 7];
  const call = (wr: number, xr: number, r: Code): Code => [get(Y), get(X), get(W), get(N), get(D), get(I), r, get(ROWS), CALL, ...uleb(stripIndex(wr, xr))];
  const stepI = (k: number): Code => [add(get(I), i32(k)), set(I)];
  return [
    1,
    2,
    I32,
    i32(0),
    set(I),
    // rows === 1: 8-row strips.
    [BLOCK, VOID, get(ROWS), i32(1), I32_NE, BR_IF, 0, whileNot([add(get(I), i32(8)), get(D), I32_GT_U], [call(8, 1, i32(0)), DROP, stepI(8)]), END],
    whileNot([add(get(I), i32(4)), get(D), I32_GT_U], [call(4, 2, i32(0)), set(R), call(4, 1, get(R)), DROP, stepI(4)]),
    whileNot([get(I), get(D), I32_GE_U], [call(1, 1, i32(0)), DROP, stepI(1)]),
    END,
  ];
}

function section(id: number, body: number[]): number[] {
  return [id, ...uleb(body.length), ...body];
}

function vec(items: number[][]): number[] {
  return [...uleb(items.length), ...items.flat()];
}

function name(s: string): number[] {
  const b = Array.from(new TextEncoder().encode(s));
  return [...uleb(b.length), ...b];
}

export function simdModuleBytes(): Uint8Array {
  const funcType = (params: number[], results: number[]): number[] => [0x60, ...vec(params.map((p) => [p])), ...vec(results.map((r) => [r]))];
  const types = [
    funcType([V128, I32, I32, I32, I32], [F32]), // 0: fin
    funcType([I32, I32, I32, I32, I32, I32, I32, I32], [I32]), // 1: strip
    funcType([I32, I32, I32, I32, I32, I32], []), // 2: matmul
  ];
  const bodies = [finBody(), ...strips.map(([a, b]) => stripBody(a, b)), matmulBody()].map((c) => {
    const b = flat(c);
    return [...uleb(b.length), ...b];
  });
  const bytes = [
    0x00,
    0x61,
    0x73,
    0x6d,
    0x01,
    0x00,
    0x00,
    0x00,
    ...section(1, vec(types)),
    // import env.mem: memory, no maximum, min 1 page
    ...section(2, vec([[...name("env"), ...name("mem"), 0x02, 0x00, 0x01]])),
    ...section(3, vec([[0], ...strips.map(() => [1]), [2]])),
    ...section(7, vec([[...name("matmul"), 0x00, ...uleb(MATMUL)]])),
    ...section(10, vec(bodies)),
  ];
  return new Uint8Array(bytes);
}
