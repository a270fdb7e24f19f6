import { expect, test } from "bun:test";
import * as api from "../../src/index.ts";

test("public_api_exports_the_named_library", () => {
  for (const name of [
    "fnv1a64",
    "blockHash",
    "promptHashes",
    "crc32c",
    "writeEnvelope",
    "readEnvelope",
    "EnvError",
    "Pcg32",
    "stream",
    "resumeRng",
    "KvPool",
  ]) {
    expect(typeof (api as Record<string, unknown>)[name]).toBe("function");
  }
  // envelope field names as kv-block.md, camelCased
  const shape = { blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 };
  const payload = new Uint8Array(api.blockPayloadBytes(shape));
  const env = api.writeEnvelope({ version: 1, dtype: 1, nBlocks: 1, ...shape }, [{ hash: api.promptHashes([1, 2], 2)[0]!, nTokens: 2, payload }]);
  const { header, records } = api.readEnvelope(env, shape);
  expect(header).toEqual({ version: 1, dtype: 1, nBlocks: 1, blockTokens: 2, nLayers: 1, nKvHeads: 1, headDim: 2 });
  expect(records[0]!.hash).toBe(0xa91ab0c1027b9366n);
  try {
    api.readEnvelope(env.subarray(0, 10));
    throw new Error("not refused");
  } catch (e) {
    expect(e).toBeInstanceOf(api.EnvError);
    expect((e as api.EnvError).kind).toBe("Format");
  }
});
