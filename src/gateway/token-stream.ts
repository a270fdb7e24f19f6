import { fromWire, sseData, type TokenQueue } from "../http/index.ts";

/**
 * POSTs a streaming completion with `return_token_ids` to an engine and feeds the ids
 * into `q`. A refusal, an error event, or a stream that ends without `[DONE]` closes
 * `q` with an error, so the client sees a failure and never a silent truncation.
 * `onAccepted` runs once the engine answered 200 (for a resume: it claimed the handle).
 */
export async function readTokenStream(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  q: TokenQueue,
  signal: AbortSignal,
  onAccepted: () => void,
): Promise<void> {
  try {
    const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body), signal });
    if (res.status !== 200) {
      const text = await res.text();
      let msg = text;
      try {
        msg = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text;
      } catch {}
      q.close({ reason: "error", error: `${url} answered ${res.status}: ${msg}` });
      return;
    }
    onAccepted();
    let finish: string | null = null;
    for await (const data of sseData(res.body!)) {
      if (data === "[DONE]") {
        q.close({ reason: finish === "length" ? "length" : "stop" });
        return;
      }
      const obj = JSON.parse(data) as { error?: { message?: string }; choices?: { token_ids?: number[]; tl_logprobs?: unknown[]; finish_reason?: string | null }[] };
      if (obj.error) {
        q.close({ reason: "error", error: obj.error.message ?? "engine reported an error" });
        return;
      }
      for (const c of obj.choices ?? []) {
        const ids = c.token_ids ?? [];
        for (let i = 0; i < ids.length; i++) q.push(ids[i]!, fromWire(c.tl_logprobs?.[i]));
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    q.close({ reason: "error", error: `stream from ${url} ended without [DONE]` });
  } catch (e) {
    if (signal.aborted) q.close({ reason: "cancelled" });
    else q.close({ reason: "error", error: `stream from ${url} broke: ${e instanceof Error ? e.message : String(e)}` });
  }
}
