import { Engine } from "../engine/index.ts";
import { StreamDecoder } from "../tokenizer/index.ts";
import { kvPoolFor, loadModel } from "./engine-node.ts";
import { ConfigError, type Config } from "./options.ts";
import { PassWriter } from "./pass-writer.ts";
import { quote } from "../codec/index.ts";

/** The command's own options (--prompt, --max-tokens, --temperature, --seed), checked before any work. */
function generateOptions(rest: Map<string, string>): { prompt: string; maxTokens: number; temperature: number; seed: bigint } {
  const prompt = rest.get("prompt") ?? "In the beginning God created";
  const num = (name: string, dflt: number, ok: (n: number) => boolean) => {
    const v = rest.get(name);
    if (v === undefined) return dflt;
    const n = Number(v);
    if (!ok(n)) throw new ConfigError(`--${name}: bad value ${quote(v)}`);
    return n;
  };
  const maxTokens = num("max-tokens", 64, (n) => Number.isInteger(n) && n >= 1);
  const temperature = num("temperature", 0, (n) => Number.isFinite(n) && n >= 0);
  const seedRaw = rest.get("seed") ?? "0";
  if (!/^\d+$/.test(seedRaw)) throw new ConfigError(`--seed: want a non-negative integer, got ${quote(seedRaw)}`);
  for (const k of rest.keys()) if (!["prompt", "max-tokens", "temperature", "seed"].includes(k)) throw new ConfigError(`unknown option --${k}`);
  return { prompt, maxTokens, temperature, seed: BigInt(seedRaw) };
}

/** One engine in this process: prints the text as it comes, then prefill and decode speed. */
export async function generate(config: Config, rest: Map<string, string>, out: (s: string) => void = (s) => process.stdout.write(s)): Promise<void> {
  const e = config.engine;
  const { prompt, maxTokens, temperature, seed } = generateOptions(rest);

  const model = await loadModel({
    modelPath: e.model || undefined,
    tokenizerPath: e.tokenizer || undefined,
    servedModelName: e.served_model_name || undefined,
    maxSeqLen: e.max_model_len || undefined,
    dtype: e.dtype,
    threads: e.threads,
    hugePages: e.huge_pages,
    modelThread: e.model_thread,
  });
  const B = e.block_tokens;
  const tokens = model.tokenizer.encode(prompt);
  const maxModelLen = Math.min(model.maxSeqLen, e.max_model_len || Infinity);
  if (tokens.length + maxTokens > maxModelLen)
    throw new ConfigError(`prompt (${tokens.length} tokens) + --max-tokens ${maxTokens} exceeds the context of ${maxModelLen}`);
  const pool = await kvPoolFor(
    model,
    { blockTokens: B, nLayers: model.nLayers, nKvHeads: model.nKvHeads, headDim: model.headDim },
    // One sequence of prompt + output: a model's whole context (131072 for Llama 3) would ask
    // for a pool past the 4 GiB one buffer holds.
    Math.ceil((tokens.length + maxTokens) / B) + 1,
  );
  const engine = new Engine({
    model: model.runner,
    pool,
    maxModelLen,
    maxBatchTokens: Math.max(e.max_batch_tokens, tokens.length),
    eosTokenIds: model.eosIds ? [...model.eosIds] : [model.tokenizer.eos],
  });
  const text = new StreamDecoder(model.tokenizer);
  const tokensOut = new PassWriter(out);
  out(prompt);
  const t0 = performance.now();
  let tFirst = 0;
  const f = await engine.submit({
    requestId: "generate",
    promptTokens: tokens,
    sampling: { temperature, topP: 1, topK: 0, seed, maxTokens, stopTokenIds: [] },
    onToken: (t) => {
      if (tFirst === 0) tFirst = performance.now();
      if (!model.tokenizer.eosIds.includes(t)) tokensOut.write(text.push(t));
    },
  });
  const t1 = performance.now();
  tokensOut.flush();
  out(text.flush() + "\n");
  const decoded = f.outputTokens.length - 1;
  const prefillTps = (tokens.length / (tFirst - t0)) * 1000;
  const decodeTps = decoded > 0 ? (decoded / (t1 - tFirst)) * 1000 : 0;
  out(
    `[${model.name}] prefill ${tokens.length} tokens at ${prefillTps.toFixed(1)} tok/s, decode ${decoded} tokens at ${decodeTps.toFixed(1)} tok/s (${f.reason})\n`,
  );
}
