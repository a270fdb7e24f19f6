import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { GrpcRegistry, workerStatus, type WorkerIdentity } from "../../src/control/index.ts";
import { RegistryService, WorkerRegistry } from "../../src/gateway/index.ts";
import { ByteTokenizer, tokenizerFingerprint } from "../../src/tokenizer/index.ts";
import { Llama2cTokenizer } from "../../src/tokenizer/llama2c-tokenizer.ts";
import { serveGrpc, type GrpcServer } from "../../src/rpc/index.ts";

// A gateway hashes prompt blocks with its own tokenizer; an engine that tokenizes differently
// must not be routed to. The registry compares each beat's model, vocab_size and fingerprint.
const byte = new ByteTokenizer();
const other = new Llama2cTokenizer(
  Array.from({ length: 258 }, (_, i) => new TextEncoder().encode(i < 3 ? ["<unk>", "<s>", "</s>"][i]! : `p${i}`)),
  new Float32Array(258),
);
const want = { model: "m", vocabSize: byte.vocabSize, tokenizerFingerprint: tokenizerFingerprint(byte) };
const base: WorkerIdentity = {
  workerId: "d1",
  httpAddress: "127.0.0.1:1",
  grpcAddress: "127.0.0.1:2",
  kvAddress: "127.0.0.1:3",
  role: "decode",
  model: "m",
  blockTokens: 16,
  totalBlocks: 8,
  vocabSize: byte.vocabSize,
  tokenizerFingerprint: want.tokenizerFingerprint,
};
const load = { queueDepth: 0, running: 0, freeBlocks: 8, draining: false };

let server: GrpcServer, registry: WorkerRegistry, service: RegistryService, client: GrpcRegistry;
beforeAll(async () => {
  registry = new WorkerRegistry({ intervalMs: 1000 });
  service = new RegistryService(registry, { maxWorkers: 256, expect: want });
  server = await serveGrpc(service.routes);
  client = new GrpcRegistry(server.address, 1000);
});
afterAll(async () => {
  service.close();
  await server.close();
});

describe("gateway refuses engines that tokenize differently", () => {
  test("fingerprints tell tokenizers of the same size apart", () => {
    expect(other.vocabSize).toBe(byte.vocabSize);
    expect(tokenizerFingerprint(other)).not.toBe(tokenizerFingerprint(byte));
  });

  test("a matching engine registers; an older one reporting nothing but the model too", async () => {
    await client.heartbeat(workerStatus(base, load, 1n), 1000);
    await client.heartbeat(workerStatus({ ...base, workerId: "old", vocabSize: undefined, tokenizerFingerprint: undefined }, load, 1n), 1000);
    expect(
      registry
        .list()
        .map((w) => w.status.workerId)
        .sort(),
    ).toEqual(["d1", "old"]);
  });

  const cases: [string, Partial<WorkerIdentity>, RegExp][] = [
    ["another model name", { model: "n" }, /model "n", want "m"/],
    ["another vocabulary size", { vocabSize: 32000 }, /vocab_size 32000, want 258/],
    ["another tokenizer of the same size", { tokenizerFingerprint: tokenizerFingerprint(other) }, /tokenizer fingerprint [0-9a-f]{16}, want [0-9a-f]{16}/],
  ];
  for (const [name, change, msg] of cases) {
    test(`${name}: FAILED_PRECONDITION naming both values, not listed`, async () => {
      const id = `bad-${name.replaceAll(" ", "-")}`;
      const err = await client.heartbeat(workerStatus({ ...base, workerId: id, ...change }, load, 1n), 1000).then(
        () => null,
        (e: Error) => e,
      );
      expect(err?.message).toMatch(msg);
      expect(err?.message).toMatch(/failed_precondition|FAILED_PRECONDITION/i);
      expect(registry.list().some((w) => w.status.workerId === id)).toBe(false);
    });
  }
});
