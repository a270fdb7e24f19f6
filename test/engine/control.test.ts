import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { FAILED_SIDE_HEADER, failedSideOf } from "../../src/handoff/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel } from "../support/nodes.ts";

let P: EngineNode, D: EngineNode;
beforeAll(async () => {
  [P, D] = await Promise.all([
    startEngineNode({ role: "prefill", model: fakeServedModel(), blockTokens: 4, numBlocks: 32, maxModelLen: 64 }),
    startEngineNode({ role: "decode", model: fakeServedModel(), blockTokens: 4, numBlocks: 32, maxModelLen: 64 }),
  ]);
});
afterAll(async () => {
  await Promise.all([P?.shutdown(), D?.shutdown()]);
});

interface Init {
  requestId?: string;
  promptTokens?: number[];
  prompt?: string;
  sampling?: { maxTokens?: number; temperature?: number; topP?: number; topK?: number; seed?: bigint };
  decodeTarget?: string;
  kvFormat?: number;
}
const good = (): Init => ({ requestId: "r1", promptTokens: [1, 2, 3, 4, 5], sampling: { maxTokens: 4 }, decodeTarget: D.kvAddress, kvFormat: 1 });

async function refused(node: EngineNode, init: Init): Promise<Code> {
  const idle = node.engine.inFlight === 0;
  const steps = node.engine.stats.steps;
  const used = node.pool.used;
  try {
    await grpcClient(EngineControl, node.grpcAddress).prefill(create(PrefillRequestSchema, init));
  } catch (e) {
    // refused before any work
    if (idle) expect([node.engine.stats.steps, node.pool.used]).toEqual([steps, used]);
    return ConnectError.from(e).code;
  }
  throw new Error(`not refused: ${JSON.stringify(init, (_k, v) => (typeof v === "bigint" ? String(v) : v))}`);
}

describe("prefill rpc validation and info", () => {
  test("every bad request is refused before work with the contract's code", async () => {
    expect(await refused(D, good())).toBe(Code.FailedPrecondition); // no prefill role
    const cases: [Partial<Init>, Code][] = [
      [{ requestId: "" }, Code.InvalidArgument],
      [{ decodeTarget: "" }, Code.InvalidArgument],
      [{ promptTokens: [] }, Code.InvalidArgument], // neither form
      [{ prompt: "text too" }, Code.InvalidArgument], // both forms
      [{ sampling: { maxTokens: 0 } }, Code.InvalidArgument],
      [{ sampling: { maxTokens: 4, temperature: -1 } }, Code.InvalidArgument],
      [{ sampling: { maxTokens: 4, topP: 1.5 } }, Code.InvalidArgument],
      [{ sampling: { maxTokens: 4, temperature: Number.NaN } }, Code.InvalidArgument],
      [{ sampling: undefined }, Code.InvalidArgument],
      [{ promptTokens: [1, 2, 258] }, Code.InvalidArgument], // token id ≥ vocab (258)
      [{ sampling: { maxTokens: 60 } }, Code.InvalidArgument], // 5 + 60 > max_model_len 64
      [{ kvFormat: 2 }, Code.FailedPrecondition],
      [{ kvFormat: 0 }, Code.FailedPrecondition],
    ];
    for (const [patch, code] of cases) {
      expect({ patch: Object.keys(patch), code: await refused(P, { ...good(), ...patch }) }).toEqual({ patch: Object.keys(patch), code });
    }
  });

  test("a good request pushes; a text prompt is tokenized; a finished first token pushes nothing", async () => {
    const ctl = grpcClient(EngineControl, P.grpcAddress);
    const h = await ctl.prefill(create(PrefillRequestSchema, { ...good(), requestId: "ok1" }));
    expect([h.blocksSent, h.blocksDeduped, h.finished]).toEqual([2, 0, false]);
    expect(D.receiver!.release(h.handleId)).toBe(true);
    const t = await ctl.prefill(create(PrefillRequestSchema, { ...good(), requestId: "ok2", promptTokens: [], prompt: "hey" }));
    expect(t.promptTokens).toEqual([256, 104, 101, 121]);
    D.receiver!.release(t.handleId);
    const one = await ctl.prefill(create(PrefillRequestSchema, { ...good(), requestId: "ok3", sampling: { maxTokens: 1 } }));
    expect([one.finished, one.blocksSent, D.receiver!.pending()]).toEqual([true, 0, 0]);
    expect(P.pool.used).toBe(0);
  });

  test("a failed Prefill names the side that failed in its metadata, not in its message", async () => {
    const ctl = grpcClient(EngineControl, P.grpcAddress);
    const failure = (init: Init) =>
      ctl.prefill(create(PrefillRequestSchema, init)).then(
        () => null,
        (e: unknown) => ConnectError.from(e),
      );
    // Nothing listens at the decode target: the push failed, D's side.
    const dead = await failure({ ...good(), requestId: "dead-d", decodeTarget: "127.0.0.1:1" });
    expect([dead?.code, dead && failedSideOf(dead.metadata), dead?.metadata.get(FAILED_SIDE_HEADER)]).toEqual([Code.Unavailable, "decode", "decode"]);
    // A request P refuses is P's.
    const bad = await failure({ ...good(), requestId: "bad-p", kvFormat: 2 });
    expect([bad?.code, bad && failedSideOf(bad.metadata)]).toEqual([Code.FailedPrecondition, "prefill"]);
    expect(P.pool.used).toBe(0);
  });

  test("Info is live; Cancel frees; Drain stops admission and returns the remaining count", async () => {
    const node = await startEngineNode({ role: "both", model: fakeServedModel(), blockTokens: 4, numBlocks: 32, maxModelLen: 200 });
    try {
      const ctl = grpcClient(EngineControl, node.grpcAddress);
      const idle = await ctl.info({});
      expect(idle).toMatchObject({
        workerId: node.workerId,
        roles: ["prefill", "decode"],
        model: "fake",
        kvFormat: 1,
        blockTokens: 4,
        nLayers: 2,
        nKvHeads: 2,
        headDim: 4,
        totalBlocks: 32,
        freeBlocks: 32,
        queueDepth: 0,
        running: 0,
        draining: false,
        maxModelLen: 200,
        vocabSize: 258,
      });
      (node.model.runner as FakeRunner).slowMs = 5;
      const stream = fetch(`http://${node.httpAddress}/v1/completions`, {
        method: "POST",
        headers: { "x-request-id": "long" },
        body: JSON.stringify({ prompt: "a long one", max_tokens: 150, temperature: 0, stream: true }),
      });
      await Bun.sleep(50);
      const busy = await ctl.info({});
      expect(busy.running).toBe(1);
      expect(busy.freeBlocks).toBeLessThan(32);
      const drained = await ctl.drain({ deadlineMs: 20n });
      expect(drained.remaining).toBe(1);
      expect((await ctl.info({})).draining).toBe(true);
      const refusedHttp = await fetch(`http://${node.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: "x", max_tokens: 2 }) });
      expect(refusedHttp.status).toBe(503);
      expect(await refused(node, { ...good(), requestId: "late" })).toBe(Code.Unavailable);
      // Drain honours its deadline: what still ran at it was cut, so nothing is left to cancel.
      expect((await ctl.cancel({ requestId: "long" })).cancelled).toBe(false);
      const events = await (await stream).text();
      expect(events).toContain("cancelled"); // an error event, not a silent end
      expect(events).not.toContain("[DONE]");
      expect(node.pool.used).toBe(0);
      expect((await ctl.drain({ deadlineMs: 0n })).remaining).toBe(0);
    } finally {
      await node.shutdown();
    }
  });
});
