/**
 * The data of each server-sent event in `body`, as soon as the event is complete: its
 * `data: ` lines joined by "\n" (the SSE rule); events without data are skipped. Ends
 * with the body; an event the body ends inside (no blank line after it) is dropped, as
 * an EventSource drops it. Leaving the loop early cancels the body.
 */
export async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let buf = "";
  const decoder = new TextDecoder();
  for await (const bytes of body) {
    buf += decoder.decode(bytes, { stream: true });
    let cut: number;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6))
        .join("\n");
      if (data !== "") yield data;
    }
  }
}
