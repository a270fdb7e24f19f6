import { fromWire, sseData, type StreamEnd, type TokenQueue } from "../http/index.ts";

/**
 * POSTs a streaming completion with `return_token_ids` to an engine and feeds the ids
 * into `q`. A refusal, an error event, or a stream that ends without `[DONE]` closes
 * `q` with an error, so the client sees a failure and never a silent truncation.
 * `onAccepted` runs once the engine answered 200 (for a resume: it claimed the handle).
 * With several queues (n > 1), choice i's tokens go to queues[i].
 */
export async function readTokenStream(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  queues: TokenQueue | TokenQueue[],
  signal: AbortSignal,
  onAccepted: () => void,
): Promise<void> {
  const qs = Array.isArray(queues) ? queues : [queues];
  const closeAll = (end: StreamEnd) => qs.forEach((q) => q.close(end));
  try {
    const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body), signal });
    if (res.status !== 200) {
      const text = await res.text();
      let msg = text;
      try {
        msg = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text;
      } catch {}
      closeAll({ reason: "error", error: `${url} answered ${res.status}: ${msg}` });
      return;
    }
    onAccepted();
    const finish: (string | null)[] = qs.map(() => null);
    for await (const data of sseData(res.body!)) {
      if (data === "[DONE]") {
        qs.forEach((q, i) => q.close({ reason: finish[i] === "length" ? "length" : "stop" }));
        return;
      }
      const obj = JSON.parse(data) as {
        error?: { message?: string };
        choices?: { index?: number; token_ids?: number[]; tl_logprobs?: unknown[]; finish_reason?: string | null }[];
      };
      if (obj.error) {
        closeAll({ reason: "error", error: obj.error.message ?? "engine reported an error" });
        return;
      }
      for (const c of obj.choices ?? []) {
        const k = c.index ?? 0;
        const q = qs[k];
        if (q === undefined) throw new Error(`choice index ${k} outside 0..${qs.length - 1}`);
        const ids = c.token_ids ?? [];
        for (let i = 0; i < ids.length; i++) q.push(ids[i]!, fromWire(c.tl_logprobs?.[i]));
        if (c.finish_reason) finish[k] = c.finish_reason;
      }
    }
    closeAll({ reason: "error", error: `stream from ${url} ended without [DONE]` });
  } catch (e) {
    if (signal.aborted) closeAll({ reason: "cancelled" });
    else closeAll({ reason: "error", error: `stream from ${url} broke: ${e instanceof Error ? e.message : String(e)}` });
  }
}
