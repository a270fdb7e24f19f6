// Structured outputs: what a JSON schema costs. Time to first token and time per output token of
// the same seeded requests with and without a JSON schema, at batch 1 and 8, on the embedded
// model (tl-kjv-small, its own 1024-token vocabulary) and on a SmolLM2-135M-shape synthetic model
// (49,152 tokens, the vocabulary masks are made for); each ratio is constrained / unconstrained in
// the same run, in alternating rounds. Then the grammar compile time of a few schemas, and the
// time to make and apply one token's mask, on both vocabularies.
//
// BENCH_ROUNDS (default 5), BENCH_TOKENS (output tokens per request, default 48),
// BENCH_PARTS=kjv,135m,compile (default all).
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { loadModel, startEngineNode } from "../src/cli/engine-node.ts";
import { blockPayloadBytes } from "../src/codec/index.ts";
import { Engine, type SamplingParams, WorkerPort } from "../src/engine/index.ts";
import { ConstraintCompiler, type ConstraintSpec, type GrammarVocab } from "../src/grammar/index.ts";
import { BYTE_TO_CHAR } from "../src/tokenizer/byte-level.ts";
import { grammarVocab } from "../src/tokenizer/index.ts";
import { kvShapeOf, loadTokenizerFor, type ModelConfig, ModelWorker } from "../src/model/index.ts";
import { syntheticWeights } from "../src/model/compute/weights.ts";
import { writeLlama2cCheckpoint } from "../src/model/load/llama2c.ts";
import { KvPool } from "../src/pool/index.ts";
import { applyTokenBitmask } from "../src/rng/index.ts";
import { loadAverage, median } from "./stats.ts";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const TOKENS = Number(process.env.BENCH_TOKENS ?? 48);
const PARTS = new Set((process.env.BENCH_PARTS ?? "kjv,135m,compile").split(","));
const THREADS = Number(process.env.BENCH_THREADS ?? availableParallelism());
const BATCHES = [1, 8];

/** SmolLM2-135M's shape (its config.json), weights seeded at random: the cost of a forward, not its text. */
const SMOL_SHAPE: ModelConfig = {
  name: "smollm2-135m-shape",
  dim: 576,
  hiddenDim: 1536,
  nLayers: 30,
  nHeads: 9,
  nKvHeads: 3,
  vocabSize: 49152,
  maxSeqLen: 256,
  ropeTheta: 100000,
  normEps: 1e-5,
};

// The output is a JSON object whose one string runs past the token budget: both sides of a ratio
// decode TOKENS tokens (the unconstrained side ignores EOS).
const LONG_SCHEMA: ConstraintSpec = {
  kind: "json_schema",
  source: JSON.stringify({ type: "object", properties: { verse: { type: "string", minLength: 400 } }, required: ["verse"] }),
};
const SCHEMAS: Record<string, ConstraintSpec> = {
  person: {
    kind: "json_schema",
    source: JSON.stringify({
      type: "object",
      properties: { name: { type: "string", maxLength: 40 }, age: { type: "integer", minimum: 0, maximum: 150 }, email: { type: "string", format: "email" } },
      required: ["name", "age"],
      additionalProperties: false,
    }),
  },
  "tool call (required, 3 tools)": {
    kind: "json_schema",
    source: JSON.stringify({
      type: "array",
      minItems: 1,
      items: {
        anyOf: ["get_weather", "find_verse", "send_mail"].map((name) => ({
          type: "object",
          properties: {
            name: { const: name },
            parameters: {
              type: "object",
              properties: { a: { type: "string" }, b: { type: "integer" }, c: { type: "array", items: { type: "number" } } },
              required: ["a"],
            },
          },
          required: ["name", "parameters"],
        })),
      },
    }),
  },
  "nested order": {
    kind: "json_schema",
    source: JSON.stringify({
      type: "object",
      properties: {
        id: { type: "string", pattern: "^[A-Z]{3}-[0-9]{4}$" },
        items: { type: "array", items: { $ref: "#/$defs/item" }, maxItems: 20 },
        shipped: { type: "boolean" },
        when: { type: "string", format: "date-time" },
      },
      required: ["id", "items"],
      $defs: {
        item: {
          type: "object",
          properties: { sku: { type: "string" }, qty: { type: "integer", minimum: 1 }, price: { type: "number" } },
          required: ["sku", "qty"],
        },
      },
    }),
  },
  json_object: { kind: "json_object", source: "" },
  regex: { kind: "regex", source: "[A-Z][a-z]+ [0-9]{1,3}:[0-9]{1,3}( [a-z]+){0,12}" },
  "GBNF arithmetic": {
    kind: "grammar",
    source: 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\nfactor ::= [0-9]+ | "(" expr ")"',
  },
};

interface Round {
  ttftMs: number;
  tpotMs: number;
}

/** One batch of `batch` requests at once on `engine`; the medians over its sequences. */
async function batchRound(engine: Engine, batch: number, vocab: number, compiler: ConstraintCompiler | null, round: number): Promise<Round> {
  const compiled = compiler ? await compiler.compile(LONG_SCHEMA) : null;
  const matchers = compiled ? await Promise.all(Array.from({ length: batch }, () => compiler!.matcher(compiled))) : [];
  const ttft: number[] = [];
  const tpot: number[] = [];
  await Promise.all(
    Array.from({ length: batch }, (_, s) => {
      const sampling: SamplingParams = {
        temperature: 0.8,
        topP: 1,
        topK: 0,
        seed: BigInt(1000 * (round + 2) + s),
        maxTokens: TOKENS,
        stopTokenIds: [],
        ignoreEos: compiler === null,
      };
      const start = performance.now();
      let first = 0;
      let last = 0;
      let n = 0;
      return engine
        .submit({
          requestId: `r${round}-${s}-${compiler ? "c" : "u"}`,
          promptTokens: Array.from({ length: 24 }, (_, i) => (37 * (i + 1) + 11 * s + round + 2) % vocab),
          sampling,
          onToken: () => {
            last = performance.now();
            if (n++ === 0) first = last;
          },
          ...(compiled ? { constraint: matchers[s]! } : {}),
        })
        .then((f) => {
          if (f.reason === "error") throw new Error(`request failed: ${f.error}`);
          ttft.push(first - start);
          if (n > 1) tpot.push((last - first) / (n - 1));
        });
    }),
  );
  return { ttftMs: median(ttft), tpotMs: median(tpot) };
}

/** Alternating rounds (unconstrained first on even rounds) at each batch size; one warm-up round each, not counted. */
async function ratios(label: string, engine: Engine, vocab: number, compiler: ConstraintCompiler) {
  const out: Record<string, unknown> = {};
  for (const batch of BATCHES) {
    await batchRound(engine, batch, vocab, null, -1);
    await batchRound(engine, batch, vocab, compiler, -2);
    const free: Round[] = [];
    const json: Round[] = [];
    const load: string[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const order = r % 2 === 0 ? [null, compiler] : [compiler, null];
      for (const c of order) (c ? json : free).push(await batchRound(engine, batch, vocab, c, r));
      load.push(loadAverage());
    }
    const m = (rs: Round[], k: keyof Round) => median(rs.map((x) => x[k]));
    const row = {
      batch,
      unconstrained: { ttftMs: m(free, "ttftMs"), tpotMs: m(free, "tpotMs") },
      jsonSchema: { ttftMs: m(json, "ttftMs"), tpotMs: m(json, "tpotMs") },
      ttftRatio: m(json, "ttftMs") / m(free, "ttftMs"),
      tpotRatio: m(json, "tpotMs") / m(free, "tpotMs"),
      // Per round, so a change of load shows: each round's own ratio.
      roundTpotRatios: json.map((j, i) => j.tpotMs / free[i]!.tpotMs),
      loadavg: load,
    };
    console.log(
      `${label} batch ${batch}: TTFT ${row.unconstrained.ttftMs.toFixed(1)} → ${row.jsonSchema.ttftMs.toFixed(1)} ms (×${row.ttftRatio.toFixed(3)}), ` +
        `TPOT ${row.unconstrained.tpotMs.toFixed(2)} → ${row.jsonSchema.tpotMs.toFixed(2)} ms (×${row.tpotRatio.toFixed(3)}); load ${load.at(-1)}`,
    );
    out[`batch${batch}`] = row;
  }
  return out;
}

/** The 135M shape's vocabulary for masks: the 256 byte tokens, then pieces of 2-8 characters, as a BPE vocabulary is. */
function syntheticVocab(n: number): GrammarVocab {
  const encoded: string[] = ["", ...BYTE_TO_CHAR];
  let s = 12345;
  const rnd = () => (s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32;
  const alphabet = 'etaoinshrdlucmfwypvbgkjqxz ETAOINSHRDLU{}[]":,.0123456789_-';
  while (encoded.length < n) {
    let piece = "";
    const len = 2 + Math.floor(rnd() * 7);
    for (let i = 0; i < len; i++) piece += alphabet[Math.floor(rnd() * alphabet.length)]!.replace(" ", BYTE_TO_CHAR[32]!);
    encoded.push(piece);
  }
  return { encoded, stopIds: [0] };
}

async function compileTimes(label: string, vocab: GrammarVocab) {
  let t = performance.now();
  const compiler = await ConstraintCompiler.create(vocab);
  const setupMs = performance.now() - t;
  const rows: Record<string, unknown> = {};
  for (const [name, spec] of Object.entries(SCHEMAS)) {
    const times: number[] = [];
    for (let i = 0; i < 3; i++) {
      // A fresh compiler each time: its cache would answer the second compile.
      const c = await ConstraintCompiler.create(vocab);
      t = performance.now();
      await c.compile(spec);
      times.push(performance.now() - t);
    }
    await compiler.compile(spec);
    t = performance.now();
    await compiler.compile(spec);
    const cachedMs = performance.now() - t;
    rows[name] = { compileMs: median(times), cachedMs };
    console.log(`${label}: compile ${name}: ${median(times).toFixed(2)} ms (cached ${cachedMs.toFixed(3)} ms)`);
  }
  // One token's mask made and applied, along a walk through the person schema.
  const m = await compiler.matcher(await compiler.compile(SCHEMAS.person!));
  const mask = new Int32Array(m.words);
  const logits = new Float32Array(vocab.encoded.length);
  const per: number[] = [];
  for (let step = 0; step < 64 && !m.terminated; step++) {
    logits.fill(0);
    t = performance.now();
    m.fillMask(mask);
    applyTokenBitmask(logits, mask);
    per.push(performance.now() - t);
    let pick = -1;
    for (let i = 0; i < logits.length && pick < 0; i++) if (logits[(i * 7919 + step) % logits.length] === 0) pick = (i * 7919 + step) % logits.length;
    if (pick < 0 || !m.accept(pick)) break;
  }
  m.dispose();
  const maskUs = median(per) * 1000;
  console.log(`${label}: vocabulary setup ${setupMs.toFixed(1)} ms; one token's mask made and applied: ${maskUs.toFixed(1)} us (median of ${per.length})`);
  return { vocabSize: vocab.encoded.length, setupMs, schemas: rows, maskUs };
}

const cpu = cpus()[0]?.model ?? "unknown";
console.log(`CPU: ${cpu} × ${cpus().length}; model threads ${THREADS}; load ${loadAverage()}`);
const results: Record<string, unknown> = { cpu, cores: cpus().length, threads: THREADS, rounds: ROUNDS, tokens: TOKENS, loadavgAtStart: loadAverage() };

if (PARTS.has("compile")) {
  const { tokenizer } = await loadTokenizerFor({});
  results.compile = {
    kjv: await compileTimes("tl-kjv-small (1024)", grammarVocab(tokenizer)),
    smol: await compileTimes("135M shape (49152)", syntheticVocab(SMOL_SHAPE.vocabSize)),
  };
}

if (PARTS.has("kjv")) {
  const node = await startEngineNode({ role: "both", model: await loadModel({ threads: THREADS, modelThread: "worker" }), blockTokens: 16, numBlocks: 256 });
  try {
    const compiler = await ConstraintCompiler.create(grammarVocab(node.model.tokenizer, node.engine.model.vocabSize));
    results.kjv = await ratios("tl-kjv-small", node.engine, node.engine.model.vocabSize, compiler);
  } finally {
    await node.shutdown();
    node.model.close?.();
  }
}

if (PARTS.has("135m")) {
  const dir = mkdtempSync(join(tmpdir(), "tl-bench-structured-"));
  try {
    const path = join(dir, "smol-shape.bin");
    writeLlama2cCheckpoint(path, SMOL_SHAPE, syntheticWeights(SMOL_SHAPE, 7, { sharedClassifier: true }), true);
    const tokenizerPath = join(dir, "tokenizer.bin");
    writeFileSync(tokenizerPath, "");
    const worker = await ModelWorker.start({ modelPath: path, tokenizerPath, threads: THREADS, dtype: "f32" });
    const blocks = 8 * Math.ceil((24 + TOKENS + 1) / 16) + 8;
    const shape = kvShapeOf(SMOL_SHAPE, 16);
    const room = await worker.kvSlab(blocks * blockPayloadBytes(shape));
    const pool = new KvPool(shape, blocks, room === null ? { shared: true } : { segments: room });
    const engine = new Engine({ model: new WorkerPort(worker), pool, maxModelLen: SMOL_SHAPE.maxSeqLen, maxBatchTokens: 512, maxRunning: 8 });
    try {
      results.smol = await ratios("135M shape", engine, SMOL_SHAPE.vocabSize, await ConstraintCompiler.create(syntheticVocab(SMOL_SHAPE.vocabSize)));
    } finally {
      await worker.close?.();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

results.loadavgAtEnd = loadAverage();
console.log(`load average at end: ${results.loadavgAtEnd}`);
mkdirSync(join(import.meta.dir, "results"), { recursive: true });
// A subset run (BENCH_PARTS) keeps the other parts' last results.
const file = join(import.meta.dir, "results", "structured.json");
const previous = existsSync(file) && PARTS.size < 3 ? (JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>) : {};
writeFileSync(file, `${JSON.stringify({ ...previous, ...results }, null, 2)}\n`);
