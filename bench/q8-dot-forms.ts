// Which form of an int8 dot product runs fastest under this runtime's WebAssembly, for q8_0 weights
// against q8_0 activations (issue 25: an 8B Q8_0 model's 8 sequences run at 0.72x llama.cpp, whose
// AVX-512 VNNI takes 64 multiply-adds an instruction). One thread, weights in L1 (8 KiB), four
// token rows, the inner loop alone: no model, no dispatch.
//
//   pairs      today's q8.ts: weights widened to i16 pairs (load8x8_s), i32x4.dot_i16x8_s against
//              each token's pair splatted: 8 multiply-adds an instruction, an add to accumulate.
//   relaxed16  i16x8.relaxed_dot_i8x16_i7x16_s, exact when one operand lies in 0..127 (kquants.ts'
//              THE RELAXED DOT): x split into x+ and x- (both 0..127), two dots and a subtract a
//              quad of weights, widened to i32 at once (two quads' sums would overflow i16).
//   relaxed4   i32x4.relaxed_dot_i8x16_i7x16_add_s on x+ and x-: 16 multiply-adds and the
//              accumulate in one instruction, on paper the fastest.
//
// The relaxed forms give the same integer sums (so the same bits); what matters is how the JIT
// lowers them. Prints GMAC/s and each form's ratio to pairs, alternating rounds, the load average;
// JSON to bench/results/q8-dot-forms.json (OUT=name for q8-dot-forms.<name>.json).
//
//   bun bench/q8-dot-forms.ts      (ROUNDS=5)
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { loadAverage, median } from "./stats.ts";

const SOURCE = `// Inner loops of an 8-row q8_0 strip against 4 tokens: (a) today's i16 pairs, (b) relaxed i8 x i7 with x split into x+ and x-.
// (a): weights 8 bytes a pair of 4 rows (load8x8_s), x pair splatted (16 bytes), i32x4.dot_i16x8_s: 8 MACs.
export function pairs(w: usize, x: usize, groups: i32, reps: i32): i32 {
  let s0 = i32x4.splat(0), s1 = s0, s2 = s0, s3 = s0;
  for (let r = 0; r < reps; r++) {
    let wp = w;
    for (let g = 0; g < groups; g++) {
      // one 32-weight block of 4 rows: 16 pairs
      for (let p = 0; p < 16; p++) {
        const v = v128.load8x8_s(wp + (<usize>p << 3));
        const xp = x + (<usize>p << 6);
        s0 = i32x4.add(s0, i32x4.dot_i16x8_s(v, v128.load(xp)));
        s1 = i32x4.add(s1, i32x4.dot_i16x8_s(v, v128.load(xp, 16)));
        s2 = i32x4.add(s2, i32x4.dot_i16x8_s(v, v128.load(xp, 32)));
        s3 = i32x4.add(s3, i32x4.dot_i16x8_s(v, v128.load(xp, 48)));
      }
      wp += 128;
    }
  }
  return i32x4.extract_lane(i32x4.add(i32x4.add(s0, s1), i32x4.add(s2, s3)), 0);
}
// (c): i32x4.relaxed_dot_i8x16_i7x16_add_s: lane = c + four products; x+ into p, x- into n, subtracted per block.
export function relaxed4(w: usize, x: usize, groups: i32, reps: i32): i32 {
  let t0 = i32x4.splat(0), t1 = t0, t2 = t0, t3 = t0;
  for (let r = 0; r < reps; r++) {
    let wp = w;
    for (let g = 0; g < groups; g++) {
      let p0 = i32x4.splat(0), p1 = p0, p2 = p0, p3 = p0, n0 = p0, n1 = p0, n2 = p0, n3 = p0;
      for (let p = 0; p < 8; p++) {
        const v = v128.load(wp + (<usize>p << 4));
        const xp = x + (<usize>p << 5);
        p0 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp), p0);
        n0 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 4), n0);
        p1 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 8), p1);
        n1 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 12), n1);
        p2 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 16), p2);
        n2 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 20), n2);
        p3 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 24), p3);
        n3 = i32x4.relaxed_dot_i8x16_i7x16_add_s(v, v128.load32_splat(xp, 28), n3);
      }
      t0 = i32x4.add(t0, i32x4.sub(p0, n0));
      t1 = i32x4.add(t1, i32x4.sub(p1, n1));
      t2 = i32x4.add(t2, i32x4.sub(p2, n2));
      t3 = i32x4.add(t3, i32x4.sub(p3, n3));
      wp += 128;
    }
  }
  return i32x4.extract_lane(i32x4.add(i32x4.add(t0, t1), i32x4.add(t2, t3)), 0);
}
// (b'): realistic i16 relaxed: widen every quad (extadd) so nothing overflows.
export function relaxed16(w: usize, x: usize, groups: i32, reps: i32): i32 {
  let s0 = i32x4.splat(0), s1 = s0, s2 = s0, s3 = s0;
  for (let r = 0; r < reps; r++) {
    let wp = w;
    for (let g = 0; g < groups; g++) {
      for (let p = 0; p < 8; p++) {
        const v = v128.load(wp + (<usize>p << 4));
        const xp = x + (<usize>p << 5);
        s0 = i32x4.add(s0, i32x4.extadd_pairwise_i16x8_s(i16x8.sub(i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp)), i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 4)))));
        s1 = i32x4.add(s1, i32x4.extadd_pairwise_i16x8_s(i16x8.sub(i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 8)), i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 12)))));
        s2 = i32x4.add(s2, i32x4.extadd_pairwise_i16x8_s(i16x8.sub(i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 16)), i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 20)))));
        s3 = i32x4.add(s3, i32x4.extadd_pairwise_i16x8_s(i16x8.sub(i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 24)), i16x8.relaxed_dot_i8x16_i7x16_s(v, v128.load32_splat(xp, 28)))));
      }
      wp += 128;
    }
  }
  return i32x4.extract_lane(i32x4.add(i32x4.add(s0, s1), i32x4.add(s2, s3)), 0);
}
`;

const FORMS = ["pairs", "relaxed16", "relaxed4"] as const;
const ROUNDS = Number(process.env.ROUNDS ?? 5);
const tmp = mkdtempSync(join(tmpdir(), "q8-dot-forms-"));
let wasm: Uint8Array;
try {
  writeFileSync(join(tmp, "forms.ts"), SOURCE);
  execFileSync(
    "npx",
    ["asc", join(tmp, "forms.ts"), "-O3", "--runtime", "stub", "--noAssert", "--importMemory", "--enable", "simd,relaxed-simd", "-o", join(tmp, "forms.wasm")],
    { stdio: "inherit" },
  );
  wasm = readFileSync(join(tmp, "forms.wasm"));
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
const memory = new WebAssembly.Memory({ initial: 64 });
const ex = new WebAssembly.Instance(new WebAssembly.Module(wasm), { env: { memory } }).exports as Record<
  (typeof FORMS)[number],
  (w: number, x: number, groups: number, reps: number) => number
>;
const u8 = new Uint8Array(memory.buffer);
// Bytes in 0..127: valid weights, and valid x+ / x- for the relaxed forms.
for (let i = 0; i < u8.length; i++) u8[i] = (i * 37) & 0x7f;
const W = 65536;
const X = 1 << 20;
const GROUPS = 64;
const REPS = 20000;
// A group: one 32-weight block of four rows against four token rows.
const MACS = GROUPS * 32 * 4 * 4 * REPS;

const loadBefore = loadAverage();
const rates: Record<string, number[]> = Object.fromEntries(FORMS.map((f) => [f, []]));
for (const f of FORMS) ex[f](W, X, GROUPS, 100);
for (let r = 0; r < ROUNDS; r++) {
  for (const f of FORMS) {
    const t = performance.now();
    ex[f](W, X, GROUPS, REPS);
    rates[f]!.push(MACS / (performance.now() - t) / 1e6);
  }
}
const med = Object.fromEntries(FORMS.map((f) => [f, median(rates[f]!)]));
for (const f of FORMS) console.log(`${f.padEnd(10)} ${med[f]!.toFixed(1)} GMAC/s  ${(med[f]! / med.pairs!).toFixed(2)}x pairs`);
const loadAfter = loadAverage();
console.log(`${cpus()[0]?.model ?? "?"}; load average ${loadBefore} -> ${loadAfter}`);
const dir = join(import.meta.dir, "results");
mkdirSync(dir, { recursive: true });
const out = {
  bench: "q8-dot-forms",
  cpu: cpus()[0]?.model ?? null,
  rounds: ROUNDS,
  loadBefore,
  loadAfter,
  gmacs: med,
  ratioToPairs: Object.fromEntries(FORMS.map((f) => [f, med[f]! / med.pairs!])),
  all: rates,
};
writeFileSync(join(dir, process.env.OUT ? `q8-dot-forms.${process.env.OUT}.json` : "q8-dot-forms.json"), `${JSON.stringify(out, null, 2)}\n`);
