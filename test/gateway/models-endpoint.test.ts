// The gateway's /v1/models shows what engines show of their model (parameters, dtype,
// resident_bytes), taken from the registry: engines report them in every beat (WorkerStatus
// 17-19) and in Info (InfoResponse 17-19).
import { afterAll, expect, test } from "bun:test";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { EngineControl } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { fakeServedModel, startLoneGateway } from "../support/nodes.ts";

const nodes: EngineNode[] = [];
afterAll(async () => {
  for (const n of nodes) await n.shutdown();
});

test("gateway models lists the engines model stats", async () => {
  const stats = { parameters: 3_500_000, dtype: "bf16", residentBytes: 7_000_000 };
  const gateway = await startLoneGateway();
  const models = async (address: string) => ((await (await fetch(`http://${address}/v1/models`)).json()) as { data: Record<string, unknown>[] }).data[0]!;
  try {
    // No engine yet: nothing to report, and nothing made up.
    expect(await models(gateway.httpAddress)).toEqual({ id: "fake", object: "model", created: 0, owned_by: "tl-engine", max_model_len: 512 });
    const n = await startEngineNode({
      role: "both",
      model: { ...fakeServedModel(), stats },
      gatewayRegistry: gateway.registryAddress,
      heartbeatIntervalMs: 100,
    });
    nodes.push(n);
    for (let i = 0; i < 200 && gateway.registry.live().length === 0; i++) await Bun.sleep(10);
    const want = { parameters: 3_500_000, dtype: "bf16", resident_bytes: 7_000_000 };
    expect(await models(n.httpAddress)).toMatchObject(want);
    expect(await models(gateway.httpAddress)).toMatchObject(want);
    const info = await grpcClient(EngineControl, n.grpcAddress).info({});
    expect({ parameters: info.parameters, dtype: info.dtype, residentBytes: info.residentBytes }).toEqual({
      parameters: 3_500_000n,
      dtype: "bf16",
      residentBytes: 7_000_000n,
    });
  } finally {
    await gateway.stop();
  }
});
