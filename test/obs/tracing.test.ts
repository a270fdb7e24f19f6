import { afterAll, expect, test } from "bun:test";
import { SpanKind, trace } from "@opentelemetry/api";
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import type { Socket } from "bun";
import { setupTracing, startSpan, traceparentOf, tracingEnabled, tracingEndpoint } from "../../src/obs/index.ts";
import { DataPlaneClient, KV_FORMAT, type KvChunkLike } from "../../src/transfer/index.ts";
import { encodeAck, FRAME_CHUNK, FRAME_END, FRAME_HEAD, FRAME_TRACE, frameBytes } from "../../src/transfer/wire/index.ts";
import { startTestCluster, type TestCluster } from "../support/nodes.ts";

// One provider for this test process, set up by the first traced test (after the
// tracing-off ones) and removed at the end so other files run untraced.
const exporter = new InMemorySpanExporter();
let stopTracing: (() => Promise<void>) | undefined;
function traced(): void {
  stopTracing ??= setupTracing({ serviceName: "tl-engine-test", exporter });
  expect(tracingEnabled()).toBe(true);
}
afterAll(async () => {
  await stopTracing?.();
});

const BODY = { prompt: "The quick brown fox jumps over", max_tokens: 5, temperature: 0 };

async function complete(c: TestCluster): Promise<Response> {
  const res = await fetch(`http://${c.gateway.httpAddress}/v1/completions`, { method: "POST", body: JSON.stringify(BODY) });
  expect(res.status).toBe(200);
  expect(res.headers.get("x-tl-served")).toBe("disaggregated");
  await res.json();
  return res;
}

type Want = { name: string; kind: SpanKind; role: string };
const WANT = {
  gwServer: { name: "POST /v1/completions", kind: SpanKind.SERVER, role: "gateway" },
  gwPrefill: { name: "tl.engine.v1.EngineControl/Prefill", kind: SpanKind.CLIENT, role: "gateway" },
  pPrefill: { name: "tl.engine.v1.EngineControl/Prefill", kind: SpanKind.SERVER, role: "prefill" },
  pStep: { name: "prefill", kind: SpanKind.INTERNAL, role: "prefill" },
  pTransfer: { name: "kv.transfer", kind: SpanKind.CLIENT, role: "prefill" },
  dTransfer: { name: "kv.transfer", kind: SpanKind.SERVER, role: "decode" },
  gwResume: { name: "resume", kind: SpanKind.CLIENT, role: "gateway" },
  dServer: { name: "POST /v1/completions", kind: SpanKind.SERVER, role: "decode" },
  dDecode: { name: "decode", kind: SpanKind.INTERNAL, role: "decode" },
} satisfies Record<string, Want>;

const matches = (s: ReadableSpan, w: Want) => s.name === w.name && s.kind === w.kind && s.attributes["tl.role"] === w.role;

/** Waits for one finished span of each kind in WANT (the last ones end with the request). */
async function collect(): Promise<Record<keyof typeof WANT, ReadableSpan>> {
  const end = Date.now() + 5000;
  for (;;) {
    const spans = exporter.getFinishedSpans();
    const found = Object.fromEntries(Object.entries(WANT).map(([k, w]) => [k, spans.filter((s) => matches(s, w))]));
    if (Object.values(found).every((l) => l.length > 0) || Date.now() > end) {
      for (const [k, l] of Object.entries(found)) expect({ span: k, count: l.length }).toEqual({ span: k, count: 1 });
      return Object.fromEntries(Object.entries(found).map(([k, l]) => [k, l[0]!])) as Record<keyof typeof WANT, ReadableSpan>;
    }
    await Bun.sleep(10);
  }
}

function expectChild(child: ReadableSpan, parent: ReadableSpan, remote: boolean): void {
  const p = child.parentSpanContext;
  expect({ child: child.name, parent: p?.spanId, remote: p?.isRemote ?? false }).toEqual({
    child: child.name,
    parent: parent.spanContext().spanId,
    remote,
  });
}

async function checkTrace(c: TestCluster, transport: "grpc" | "data-plane"): Promise<void> {
  exporter.reset();
  await complete(c);
  const s = await collect();
  // Every span of the request, in all three roles, is in one trace.
  const traceIds = new Set(exporter.getFinishedSpans().map((x) => x.spanContext().traceId));
  expect([...traceIds]).toEqual([s.gwServer.spanContext().traceId]);
  expect(s.gwServer.parentSpanContext).toBeUndefined();
  expectChild(s.gwPrefill, s.gwServer, false);
  expectChild(s.pPrefill, s.gwPrefill, true);
  expectChild(s.pStep, s.pPrefill, false);
  expectChild(s.pTransfer, s.pPrefill, false);
  expectChild(s.dTransfer, s.pTransfer, true);
  expectChild(s.gwResume, s.gwServer, false);
  expectChild(s.dServer, s.gwResume, true);
  expectChild(s.dDecode, s.dServer, false);
  expect(s.dTransfer.attributes["tl.kv.transport"]).toBe(transport);
  // Both ends of the transfer agree on what moved.
  expect(s.dTransfer.attributes["tl.kv.payload_bytes"]).toBe(s.pTransfer.attributes["tl.kv.payload_bytes"]!);
  expect(Number(s.pTransfer.attributes["tl.kv.blocks_sent"])).toBeGreaterThan(0);
  // D counts the first token, sampled on P, among its output.
  expect(s.dDecode.attributes["tl.output_tokens"]).toBe(BODY.max_tokens);
  expect(s.dServer.attributes["tl.kv.handle"]).toBe(s.gwResume.attributes["tl.kv.handle"]!);
  // The decode span covers the request's decoding: it starts after the transfer ended and ends with D's
  // request. The SDK anchors each span's clock to Date.now() at its start, so spans compare to within ~1 ms.
  const ms = (t: [number, number]) => t[0] * 1000 + t[1] / 1e6;
  expect(ms(s.dDecode.startTime)).toBeGreaterThan(ms(s.dTransfer.endTime) - 2);
  expect(ms(s.dDecode.endTime)).toBeLessThan(ms(s.dServer.endTime) + 2);
  expect(ms(s.dDecode.endTime)).toBeGreaterThan(ms(s.dServer.endTime) - 50);
  for (const x of Object.values(s)) expect({ span: x.name, status: x.status.code }).toEqual({ span: x.name, status: 0 });
}

test("tracing endpoint resolution", () => {
  expect(tracingEndpoint(undefined, {})).toBeUndefined();
  expect(tracingEndpoint("", {})).toBeUndefined();
  expect(tracingEndpoint("http://c:4318", {})).toBe("http://c:4318/v1/traces");
  expect(tracingEndpoint("http://c:4318/", {})).toBe("http://c:4318/v1/traces");
  expect(tracingEndpoint("http://c:4318/v1/traces", {})).toBe("http://c:4318/v1/traces");
  expect(tracingEndpoint(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: "http://env:4318" })).toBe("http://env:4318/v1/traces");
  expect(tracingEndpoint(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: "http://env:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://t:1/x" })).toBe(
    "http://t:1/x",
  );
  expect(tracingEndpoint("http://opt:4318", { OTEL_EXPORTER_OTLP_ENDPOINT: "http://env:4318" })).toBe("http://opt:4318/v1/traces");
});

test("otlp http export to configured endpoint", async () => {
  const posts: { path: string; type: string | null; body: string }[] = [];
  const collector = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      posts.push({ path: new URL(req.url).pathname, type: req.headers.get("content-type"), body: await req.text() });
      return Response.json({});
    },
  });
  try {
    const stop = setupTracing({ serviceName: "tl-engine-otlp-test", endpoint: tracingEndpoint(`http://127.0.0.1:${collector.port}`, {}) });
    expect(tracingEnabled()).toBe(true);
    startSpan("otlp.probe", SpanKind.INTERNAL).end();
    await stop(); // flushes the batch
    expect(tracingEnabled()).toBe(false);
  } finally {
    collector.stop(true);
  }
  expect(posts.map((p) => p.path)).toEqual(["/v1/traces"]);
  expect(posts[0]!.body).toContain("otlp.probe");
  expect(posts[0]!.body).toContain("tl-engine-otlp-test");
});

test("tracing off records nothing", async () => {
  // No endpoint and no exporter: nothing is registered, the API stays the no-op one.
  const stop = setupTracing({ serviceName: "off" });
  expect(tracingEnabled()).toBe(false);
  const probe = startSpan("probe", SpanKind.SERVER);
  expect(probe.isRecording()).toBe(false);
  expect(traceparentOf(probe)).toBeUndefined();
  expect(trace.getTracer("x").startSpan("y").isRecording()).toBe(false);
  await stop();

  const c = await startTestCluster({ prefill: 1, decode: 1 });
  const sent: Headers[] = [];
  const realFetch = globalThis.fetch;
  globalThis.fetch = ((input: string | URL | Request, init?: RequestInit) => {
    sent.push(new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined)));
    return realFetch(input, init);
  }) as typeof fetch;
  try {
    await complete(c);
  } finally {
    globalThis.fetch = realFetch;
    await c.stop();
  }
  // The gateway's resume call to D went out without a traceparent...
  expect(sent.some((h) => h.has("x-tl-kv-handle"))).toBe(true);
  expect(sent.filter((h) => h.has("traceparent"))).toEqual([]);
  // ...and none of the request's spans reaches a provider registered afterwards.
  traced();
  await Bun.sleep(20);
  expect(exporter.getFinishedSpans()).toEqual([]);
});

test("trace links across roles grpc transfer", async () => {
  traced();
  const c = await startTestCluster({ prefill: 1, decode: 1, node: { useDataPlane: false } });
  try {
    await checkTrace(c, "grpc");
  } finally {
    await c.stop();
  }
});

test("trace links across roles data plane transfer", async () => {
  traced();
  const c = await startTestCluster({ prefill: 1, decode: 1 });
  try {
    await checkTrace(c, "data-plane");
  } finally {
    await c.stop();
  }
});

test("data plane trace frame only when traced", async () => {
  // A bare data plane peer: records every byte and ACKs on END.
  const got: Uint8Array[] = [];
  let bytes: number[] = [];
  const listener = Bun.listen<undefined>({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      data(s: Socket<undefined>, buf: Uint8Array) {
        bytes.push(...buf);
        const b = Uint8Array.from(bytes);
        if (b.length >= FRAME_HEAD && b[b.length - 1] === FRAME_END && frameBytes(b, b.length - FRAME_HEAD) === FRAME_HEAD) {
          got.push(b);
          bytes = [];
          s.write(encodeAck({ blocksReceived: 1, blocksDeduped: 0, payloadBytes: 0n, nTokens: 0 }));
        }
      },
    },
  });
  const client = new DataPlaneClient({ timeoutMs: 5000 });
  const chunk: KvChunkLike = { handleId: "h1", index: 0, total: 1, hash: 7n, kvFormat: KV_FORMAT, envelope: new Uint8Array(0), crc32c: 0 };
  const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  try {
    await client.push(`127.0.0.1:${listener.port}`, [chunk]);
    await client.push(`127.0.0.1:${listener.port}`, [chunk], { traceparent });
  } finally {
    await client.close();
    listener.stop(true);
  }
  expect(got.length).toBe(2);
  // Untraced: the push starts with its CHUNK, byte for byte the format without TRACE.
  expect(got[0]![4]).toBe(FRAME_CHUNK);
  // Traced: one TRACE frame carrying the traceparent, then the same push.
  const t = got[1]!;
  expect(t[4]).toBe(FRAME_TRACE);
  const len = frameBytes(t, 0);
  expect(new TextDecoder().decode(t.subarray(FRAME_HEAD, len))).toBe(traceparent);
  expect([...t.subarray(len)]).toEqual([...got[0]!]);
});
