// A client's x-request-id is kept (response header, logs, traces) but is not the request's
// internal id: two requests with the same one both run (the later one got a 409 from D).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

let C: TestCluster;
beforeAll(async () => {
  C = await startTestCluster({ prefill: 1, decode: 1 });
});
afterAll(() => C?.stop());

test("same client request id twice both served", async () => {
  const send = () =>
    fetch(`http://${C.gateway.httpAddress}/v1/completions`, {
      method: "POST",
      headers: { "x-request-id": "retry-7" },
      body: JSON.stringify({ prompt: "In the beginning", max_tokens: 24, ignore_eos: true, temperature: 0 }),
    });
  const [a, b] = await Promise.all([send(), send()]);
  expect([a.status, b.status]).toEqual([200, 200]);
  expect([a.headers.get("x-request-id"), b.headers.get("x-request-id")]).toEqual(["retry-7", "retry-7"]);
  const [ja, jb] = (await Promise.all([a.json(), b.json()])) as { id: string; choices: { text: string }[] }[];
  expect(ja!.id).not.toBe(jb!.id);
  expect(ja!.id).not.toBe("retry-7");
  expect(ja!.choices[0]!.text).toBe(jb!.choices[0]!.text);
  expect(a.headers.get("x-tl-served")).toBe("disaggregated");
});

test("bad client request id is 400", async () => {
  const r = await fetch(`http://${C.gateway.httpAddress}/v1/completions`, {
    method: "POST",
    headers: { "x-request-id": "y".repeat(300) },
    body: JSON.stringify({ prompt: "x", max_tokens: 2 }),
  });
  expect(r.status).toBe(400);
});
