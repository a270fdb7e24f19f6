import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

// Object.prototype's member names as JSON field names, on every HTTP route of the gateway
// and of an engine: an unknown field like any other (served, named in x-tl-ignored-fields),
// or a 400 naming it where the field's place takes no such key; never a 500, never JS text.
// The bodies are JSON text: a JS object literal's `__proto__` would set the prototype instead.
const NAMES = ["__proto__", "constructor", "hasOwnProperty", "toString", "valueOf", "__defineGetter__"];

let C: TestCluster;
beforeAll(async () => {
  C = await startTestCluster({ prefill: 1, decode: 1 });
});
afterAll(() => C?.stop());

const doors = () => [
  ["gateway", C.gateway.httpAddress],
  ["engine", C.decode[0]!.httpAddress],
];

async function send(addr: string, path: string, json: string): Promise<{ status: number; text: string; ignored: string | null }> {
  const res = await fetch(`http://${addr}${path}`, { method: "POST", body: json, headers: { "content-type": "application/json" } });
  return { status: res.status, text: await res.text(), ignored: res.headers.get("x-tl-ignored-fields") };
}

function noInternals(text: string): void {
  expect(text).not.toMatch(/is not a function|TypeError|undefined is not|prototype|\bat \w+ \(/);
}

const BASE = {
  "/v1/completions": `"prompt":[72,105],"max_tokens":2,"temperature":0`,
  "/v1/chat/completions": `"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0`,
} as const;

describe("Object.prototype's names as field names", () => {
  for (const name of NAMES) {
    test(`${name} at the top level is an unknown field on every POST route`, async () => {
      for (const [who, addr] of doors()) {
        for (const [path, base] of Object.entries(BASE)) {
          for (const v of ["1", '"x"', "{}", '{"a":1}', "[]"]) {
            const r = await send(addr!, path, `{${base},"${name}":${v}}`);
            noInternals(r.text);
            expect({ who, path, v, status: r.status }).toEqual({ who, path, v, status: 200 });
            expect(r.ignored?.split(",")).toContain(name);
          }
        }
      }
    });

    test(`${name} inside the request's objects`, async () => {
      for (const [who, addr] of doors()) {
        for (const [path, base] of Object.entries(BASE)) {
          // Where a field's value is an object whose keys the client picks.
          const cases: [string, number][] = [
            [`{${base},"logit_bias":{"${name}":1}}`, 400],
            [`{${base},"stream":true,"stream_options":{"${name}":true}}`, 400],
            [`{${base},"metadata":{"${name}":"x"}}`, 200],
            [`{${base},"response_format":{"type":"text","${name}":1}}`, 200],
            [`{${base},"${name}":1,"${name}":{"${name}":[]}}`, 200],
          ];
          if (path === "/v1/chat/completions") cases.push([`{"messages":[{"role":"user","content":"hi","${name}":1}],"max_tokens":2}`, 200]);
          for (const [json, want] of cases) {
            const r = await send(addr!, path, json);
            noInternals(r.text);
            expect({ who, json, status: r.status }).toEqual({ who, json, status: want });
            if (want === 400) expect(JSON.parse(r.text).error.message).toContain(name);
          }
        }
      }
    });
  }

  test("GET routes and unknown paths named after them answer as usual", async () => {
    for (const [, addr] of doors()) {
      for (const path of ["/health", "/health/live", "/v1/models", "/metrics"]) {
        const plain = await fetch(`http://${addr}${path}`);
        const res = await fetch(`http://${addr}${path}?__proto__=1&constructor=2`);
        expect({ path, status: res.status }).toEqual({ path, status: plain.status });
        await Promise.all([plain.arrayBuffer(), res.arrayBuffer()]);
      }
      for (const name of NAMES) {
        const res = await fetch(`http://${addr}/${name}`, { method: "POST", body: `{"${name}":1}` });
        expect(res.status).toBe(404);
        noInternals(await res.text());
      }
    }
  });
});
