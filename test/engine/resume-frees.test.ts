import { afterAll, beforeAll, expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { startEngineNode, type EngineNode } from "../../src/cli/engine-node.ts";
import { grpcClient } from "../../src/rpc/index.ts";
import { EngineControl, PrefillRequestSchema } from "../../src/gen/tl/engine/v1/engine_pb.ts";
import { CHOICES_HEADER, DRAWS_HEADER, FIRST_TOKEN_HEADER, HANDLE_HEADER } from "../../src/http/index.ts";
import type { FakeRunner } from "../support/fake-model.ts";
import { fakeServedModel } from "../support/nodes.ts";

// Every refusal of a resume gives back what the handle held, on D, at once.
let P: EngineNode, D: EngineNode;
beforeAll(async () => {
  // Room for the long "busy" request (403 tokens = 101 blocks) beside the pushes.
  const common = { blockTokens: 4, numBlocks: 256 };
  [P, D] = await Promise.all([
    startEngineNode({ role: "prefill", model: fakeServedModel(), ...common }),
    startEngineNode({ role: "decode", model: fakeServedModel(), ...common }),
  ]);
});
afterAll(async () => {
  await Promise.all([P, D].map((n) => n?.shutdown()));
});

const prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
// EOS ignored on both sides: every choice runs to max_tokens whatever the fake model samples.

async function push(requestId: string, n = 1) {
  return grpcClient(EngineControl, P.grpcAddress).prefill(
    create(PrefillRequestSchema, {
      requestId,
      promptTokens: prompt,
      sampling: { maxTokens: 8, temperature: 1, seed: 3n, ignoreEos: true },
      decodeTarget: D.kvAddress,
      kvFormat: 1,
      n,
    }),
  );
}

function resume(handleId: string, requestId: string, firstTokens: number[], extra: Record<string, string> = {}) {
  return fetch(`http://${D.httpAddress}/v1/completions`, {
    method: "POST",
    headers: { [HANDLE_HEADER]: handleId, [FIRST_TOKEN_HEADER]: firstTokens.join(","), [DRAWS_HEADER]: "1", "x-request-id": requestId, ...extra },
    body: JSON.stringify({ prompt, max_tokens: 8, temperature: 1, seed: 3, n: firstTokens.length, ignore_eos: true }),
  });
}

async function idle(): Promise<void> {
  const end = Date.now() + 3000;
  while ((D.engine.inFlight > 0 || D.pool.used > 0) && Date.now() < end) await Bun.sleep(5);
  expect([D.engine.inFlight, D.pool.used, D.receiver!.pending()]).toEqual([0, 0, 0]);
}

test("a resume whose client request id already runs on D is served: ids on D are its own", async () => {
  // 400 tokens (EOS ignored) at 5 ms a step: "busy" runs for the whole test, however loaded the machine.
  (D.model.runner as FakeRunner).slowMs = 5;
  try {
    const ac = new AbortController();
    const running = await fetch(`http://${D.httpAddress}/v1/completions`, {
      method: "POST",
      headers: { "x-request-id": "busy" },
      body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 400, ignore_eos: true, stream: true }),
      signal: ac.signal,
    });
    expect(running.headers.get("x-request-id")).toBe("busy");
    // Held until the end: a collected response would close the connection and cancel "busy".
    const reader = running.body!.getReader();
    await reader.read();
    (D.model.runner as FakeRunner).slowMs = 0;
    for (const n of [1, 3]) {
      const h = await push(`busy-push-${n}`, n);
      expect(D.receiver!.pending()).toBe(1);
      // The same x-request-id (it was a 409 before): claimed and decoded under an id D minted.
      const res = await resume(h.handleId, "busy", n === 1 ? [h.firstToken] : h.choiceFirstTokens);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-request-id")).toBe("busy");
      const body = (await res.json()) as { id: string; choices: { finish_reason: string }[] };
      expect(body.id).not.toBe("busy");
      expect(body.choices.map((c) => c.finish_reason)).toEqual(new Array(n).fill("length"));
      expect(D.receiver!.pending()).toBe(0);
    }
    // The first is still running, unharmed, under its own internal id.
    expect(D.engine.requestIds().length).toBe(1);
    await reader.cancel();
    ac.abort();
  } finally {
    (D.model.runner as FakeRunner).slowMs = 0;
  }
  await idle();
});

test("a client request id that is too long or not printable is a 400 before the claim", async () => {
  const h = await push("bad-id");
  for (const id of ["x".repeat(257), "two words"]) {
    const res = await resume(h.handleId, id, [h.firstToken]);
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain("x-request-id must be 1-256 printable ASCII");
    expect(D.receiver!.pending()).toBe(1);
  }
  expect((await resume(h.handleId, "ok-id", [h.firstToken])).status).toBe(200);
  await idle();
});

test("n = 3 resumed on one handle: every choice finishes and frees its blocks; a bad choice header is a 400 before the claim", async () => {
  const h = await push("three", 3);
  expect(h.choiceFirstTokens.length).toBe(3);
  const bad = await resume(h.handleId, "three", h.choiceFirstTokens, { [CHOICES_HEADER]: "0,1" });
  expect(bad.status).toBe(400);
  expect(D.receiver!.pending()).toBe(1); // refused before any work: still the gateway's to release
  const ok = await resume(h.handleId, "three", h.choiceFirstTokens);
  expect(ok.status).toBe(200);
  const body = (await ok.json()) as { choices: { index: number; finish_reason: string }[] };
  expect(body.choices.map((c) => [c.index, c.finish_reason])).toEqual([
    [0, "length"],
    [1, "length"],
    [2, "length"],
  ]);
  await idle();
});

test("n = 3 on a decode engine without room for the choices' tail copies: 503, and every block taken is back", async () => {
  const small = await startEngineNode({ role: "decode", model: fakeServedModel(), blockTokens: 4, numBlocks: 4 });
  try {
    const h = await grpcClient(EngineControl, P.grpcAddress).prefill(
      create(PrefillRequestSchema, {
        requestId: "tight",
        promptTokens: prompt,
        sampling: { maxTokens: 1, temperature: 0 },
        decodeTarget: small.kvAddress,
        kvFormat: 1,
        n: 3,
      }),
    );
    expect(h.finished).toBe(true); // max_tokens 1: every choice ended on P, nothing pushed
    const pushed = await grpcClient(EngineControl, P.grpcAddress).prefill(
      create(PrefillRequestSchema, {
        requestId: "tight2",
        promptTokens: prompt,
        sampling: { maxTokens: 4, temperature: 0 },
        decodeTarget: small.kvAddress,
        kvFormat: 1,
        n: 3,
      }),
    );
    expect(small.pool.used).toBe(3); // 2 full blocks and the tail: one block left for 2 tail copies
    const res = await fetch(`http://${small.httpAddress}/v1/completions`, {
      method: "POST",
      headers: { [HANDLE_HEADER]: pushed.handleId, [FIRST_TOKEN_HEADER]: pushed.choiceFirstTokens.join(","), [DRAWS_HEADER]: "0", "x-request-id": "tight2" },
      body: JSON.stringify({ prompt, max_tokens: 4, temperature: 0, n: 3 }),
    });
    expect(res.status).toBe(503);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/out of KV blocks: 3 choices/);
    expect([small.pool.used, small.receiver!.pending(), small.engine.inFlight]).toEqual([0, 0, 0]);
  } finally {
    await small.shutdown();
  }
});
