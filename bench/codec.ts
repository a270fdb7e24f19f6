// KV block codec throughput: envelope write and read+verify for one-block envelopes of
// the default engine shape and one large multi-block envelope; CRC-32C native against
// the pure-TS table fallback; block hashing against a BigInt FNV. Baselines are measured
// in the same run (memcpy of the same bytes, the table CRC, BigInt FNV) and printed as
// ratios. Writes bench/results/codec.json. Run: npx bun bench/codec.ts (TL_CRC32C=aws-crt
// measures aws-crt's binding against @node-rs/crc32, the default, per block).
import { mkdirSync, writeFileSync } from "node:fs";
import {
  blockPayloadBytes,
  crc32cBackend,
  crc32cNative,
  crc32cNodeRs,
  crc32cTable,
  envelopeBytes,
  promptHashes,
  readEnvelope,
  writeEnvelope,
  type EnvelopeRecord,
  type KvShape,
} from "../src/codec/index.ts";

const SHAPE: KvShape = { blockTokens: 16, nLayers: 4, nKvHeads: 4, headDim: 32 };
const P = blockPayloadBytes(SHAPE);
const MULTI = 64; // blocks in the large envelope (~2 MiB)
const MIN_MS = 400;

/** Best of 3 rounds, each repeating fn until MIN_MS passed; returns bytes per second. */
function rate(bytesPerCall: number, fn: () => void): number {
  for (let i = 0; i < 20; i++) fn();
  let best = 0;
  for (let round = 0; round < 3; round++) {
    let calls = 0;
    const t0 = performance.now();
    let t = t0;
    while (t - t0 < MIN_MS) {
      for (let i = 0; i < 16; i++) fn();
      calls += 16;
      t = performance.now();
    }
    best = Math.max(best, (calls * bytesPerCall) / ((t - t0) / 1000));
  }
  return best;
}

const gbs = (bps: number) => bps / 1e9;
let seed = 0x9e3779b9;
function fill(b: Uint8Array): Uint8Array {
  for (let i = 0; i < b.length; i++) {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    b[i] = seed & 0xff;
  }
  return b;
}

function records(n: number): EnvelopeRecord[] {
  const hashes = promptHashes(
    Array.from({ length: n * SHAPE.blockTokens }, (_, i) => i),
    SHAPE.blockTokens,
  );
  return hashes.map((hash) => ({ hash, nTokens: SHAPE.blockTokens, payload: fill(new Uint8Array(P)) }));
}

let sink = 0;
const results: Record<string, number> = {};
function report(name: string, bps: number): number {
  results[name] = gbs(bps);
  console.log(`${name.padEnd(34)} ${gbs(bps).toFixed(2)} GB/s`);
  return bps;
}

console.log(`shape B=16 L=4 H=4 D=32, P=${P}; crc32c backend: ${crc32cBackend()}`);

for (const [label, n] of [
  ["one_block", 1],
  [`multi_${MULTI}`, MULTI],
] as const) {
  const recs = records(n);
  const E = envelopeBytes(SHAPE, n);
  const header = { version: 1, dtype: 1, nBlocks: n, ...SHAPE };
  const out = new Uint8Array(E);
  const env = writeEnvelope(header, recs);
  // Baseline: copying the same payload bytes, the least any writer or reader must do.
  const dst = new Uint8Array(E);
  const memcpy = rate(E, () => {
    for (let i = 0; i < n; i++) dst.set(recs[i]!.payload, 40 + i * (12 + P));
  });
  report(`${label}.memcpy_baseline`, memcpy);
  // Baseline: CRC-32C alone over the envelope, the floor of read+verify's cost.
  const crcOnly = crc32cNative() ?? crc32cTable;
  const crcBase = report(
    `${label}.crc_only_baseline`,
    rate(E, () => void (sink ^= crcOnly(env.subarray(0, E - 4)))),
  );
  const w = report(
    `${label}.write_into`,
    rate(E, () => void writeEnvelope(header, recs, out)),
  );
  const wf = report(
    `${label}.write_fresh`,
    rate(E, () => void writeEnvelope(header, recs)),
  );
  const r = report(
    `${label}.read_verify`,
    rate(E, () => void (sink += readEnvelope(env, SHAPE).records.length)),
  );
  results[`${label}.write_into_vs_memcpy`] = w / memcpy;
  results[`${label}.write_fresh_vs_memcpy`] = wf / memcpy;
  results[`${label}.read_verify_vs_memcpy`] = r / memcpy;
  results[`${label}.read_verify_vs_crc_only`] = r / crcBase;
  results[`${label}.write_into_vs_crc_only`] = w / crcBase;
  console.log(
    `  ratios: read_verify/crc_only ${(r / crcBase).toFixed(2)}, write_into/crc_only ${(w / crcBase).toFixed(2)}, ` +
      `read_verify/memcpy ${(r / memcpy).toFixed(2)}, write_into/memcpy ${(w / memcpy).toFixed(2)}, write_fresh/memcpy ${(wf / memcpy).toFixed(2)}`,
  );
}

const buf = fill(new Uint8Array(1 << 20));
const native = crc32cNative();
const tbl = report(
  "crc32c.table_1MiB",
  rate(buf.length, () => void (sink ^= crc32cTable(buf))),
);
if (native) {
  const nat = report(
    "crc32c.native_1MiB",
    rate(buf.length, () => void (sink ^= native(buf))),
  );
  results["crc32c.native_vs_table"] = nat / tbl;
  console.log(`  ratio native (${crc32cBackend()})/table ${(nat / tbl).toFixed(1)}x`);
}
// The size a decode engine verifies one at a time: one block's envelope.
const nodeRs = crc32cNodeRs();
if (native && nodeRs && crc32cBackend() !== "node-rs") {
  const block = buf.subarray(0, envelopeBytes(SHAPE, 1) - 4);
  const a = report(
    `crc32c.${crc32cBackend()}_block`,
    rate(block.length, () => void (sink ^= native(block))),
  );
  const b = report(
    "crc32c.node_rs_block",
    rate(block.length, () => void (sink ^= nodeRs(block))),
  );
  results[`crc32c.${crc32cBackend()}_vs_node_rs_block`] = a / b;
  console.log(`  ratio ${crc32cBackend()}/@node-rs on ${block.length}-byte blocks ${(a / b).toFixed(1)}x`);
}

// Block hashing: a 4096-token prompt, chained, against BigInt-per-byte FNV.
const tokens = Uint32Array.from({ length: 4096 }, (_, i) => (i * 2654435761) >>> 0);
function promptHashesBigInt(t: Uint32Array, B: number): bigint[] {
  const out: bigint[] = [];
  let parent = 0n;
  const scratch = new DataView(new ArrayBuffer(8 + 4 * B));
  for (let b = 0; b + B <= t.length; b += B) {
    scratch.setBigUint64(0, parent, true);
    for (let j = 0; j < B; j++) scratch.setUint32(8 + 4 * j, t[b + j]!, true);
    let h = 0xcbf29ce484222325n;
    for (let i = 0; i < scratch.byteLength; i++) h = BigInt.asUintN(64, (h ^ BigInt(scratch.getUint8(i))) * 0x100000001b3n);
    parent = h === 0n ? 1n : h;
    out.push(parent);
  }
  return out;
}
const hashBytes = tokens.length * 4;
const fast = rate(hashBytes, () => void (sink += promptHashes(tokens, 16).length));
const slow = rate(hashBytes, () => void (sink += promptHashesBigInt(tokens, 16).length));
results["prompt_hashes.tokens_per_s"] = fast / 4;
results["prompt_hashes.bigint_tokens_per_s"] = slow / 4;
results["prompt_hashes.vs_bigint"] = fast / slow;
console.log(
  `prompt_hashes                      ${(fast / 4 / 1e6).toFixed(1)} Mtokens/s, BigInt FNV ${(slow / 4 / 1e6).toFixed(2)} Mtokens/s, ratio ${(fast / slow).toFixed(1)}x`,
);

const target = results["one_block.read_verify"]! >= 3;
console.log(`target read+verify ≥ 3 GB/s on one-block envelopes: ${target ? "met" : "NOT met"}`);

mkdirSync(new URL("./results/", import.meta.url), { recursive: true });
writeFileSync(
  new URL("./results/codec.json", import.meta.url),
  JSON.stringify(
    {
      shape: SHAPE,
      payload_bytes: P,
      multi_blocks: MULTI,
      crc32c_backend: crc32cBackend(),
      unit: "GB/s unless named",
      results,
      read_verify_target_met: target,
      sink: sink & 1,
    },
    null,
    2,
  ) + "\n",
);
