import { sseData } from "../http/index.ts";
import { log } from "../obs/index.ts";

/** The demo request: seeded sampling, so the colocated run must give the same words. */
const DEMO_REQUEST = {
  prompt: "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel,",
  max_tokens: 40,
  stream: true,
  seed: 7,
  temperature: 0.8,
};

/**
 * One request through the gateway (prefill on P, KV pushed to D, decode on D), the same request
 * again (its prompt blocks now cached on D), and once more on a single engine with no hand-off.
 * With several replicas (`beatMs` > 0) the second request reaches another replica, which
 * learns where the prompt's blocks are from the decode engines' next beat: it waits for one.
 */
export async function demo(base: string, colocatedHttp: string | undefined, print: (s: string) => void, auth: Record<string, string>, beatMs = 0) {
  print(`\ndemo: one prompt, sampled (seed ${DEMO_REQUEST.seed}, temperature ${DEMO_REQUEST.temperature}, ${DEMO_REQUEST.max_tokens} tokens)`);
  const disagg = await streamCompletion(base, auth);
  if (typeof disagg === "string") return print(`  demo failed: ${disagg}`);
  const h = disagg.headers;
  // Which replica served it, when there are several.
  const by = (hs: Headers) => (beatMs > 0 ? ` by ${hs.get("x-tl-gateway")}` : "");
  print(
    `  ${h.get("x-tl-served")}${by(h)}: prefill on ${h.get("x-tl-prefill-worker")}, decode on ${h.get("x-tl-decode-worker")}, KV blocks sent ${h.get("x-tl-blocks-sent")}`,
  );
  print(`    > ${JSON.stringify(DEMO_REQUEST.prompt + disagg.text)}`);
  if (beatMs > 0) await Bun.sleep(beatMs + 200);
  const again = await streamCompletion(base, auth);
  if (typeof again !== "string") {
    const a = again.headers;
    print(
      `  again${by(a)}: decode on ${a.get("x-tl-decode-worker")}, KV blocks sent ${a.get("x-tl-blocks-sent")}, deduped ${a.get("x-tl-blocks-deduped")} (already there)`,
    );
  }
  if (colocatedHttp === undefined) return;
  const local = await streamCompletion(`http://${colocatedHttp}`, auth);
  if (typeof local === "string") return print(`  colocated run failed: ${local}`);
  print(`  colocated on one engine (${colocatedHttp}), no KV hand-off:`);
  print(`    > ${JSON.stringify(DEMO_REQUEST.prompt + local.text)}`);
  print(`  same text: ${local.text === disagg.text ? "yes" : "NO"}`);
  log.debug("demo done");
}

/** The demo request streamed from `base`: its text and headers, or why it failed. */
async function streamCompletion(base: string, auth: Record<string, string>): Promise<{ text: string; headers: Headers } | string> {
  const headers = { "content-type": "application/json", ...auth };
  // A connection per request: behind the front port, each may reach another replica.
  const res = await fetch(`${base}/v1/completions`, { method: "POST", headers, body: JSON.stringify(DEMO_REQUEST), keepalive: false });
  if (res.status !== 200) return `${res.status} ${await res.text()}`;
  let text = "";
  for await (const data of sseData(res.body!)) {
    if (data === "[DONE]") break;
    const obj = JSON.parse(data) as { choices?: { text?: string }[] };
    text += obj.choices?.[0]?.text ?? "";
  }
  return { text, headers: res.headers };
}
