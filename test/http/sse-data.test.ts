import { expect, test } from "bun:test";
import { sseData } from "../../src/http/index.ts";

/** A body that hands over `text` in pieces of the given byte sizes (UTF-8 may be cut mid-character). */
function body(text: string, sizes: number[], onCancel?: () => void): ReadableStream<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  let o = 0;
  let k = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (o >= bytes.length) return c.close();
      const n = sizes[k++ % sizes.length]!;
      c.enqueue(bytes.slice(o, o + n));
      o += n;
    },
    cancel: onCancel,
  });
}

test("sse data yields each event whatever the chunking", async () => {
  const text = 'data: {"a":"é€"}\n\n: a comment\n\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\ndata: cut off';
  for (const sizes of [[1], [2, 3], [7], [text.length * 4]]) {
    const got: string[] = [];
    for await (const d of sseData(body(text, sizes))) got.push(d);
    expect([sizes.join(","), got]).toEqual([sizes.join(","), ['{"a":"é€"}', "one\ntwo", "[DONE]"]]);
  }
});

test("sse data left early cancels the body", async () => {
  let cancelled = false;
  for await (const d of sseData(body("data: 1\n\ndata: 2\n\n", [9], () => (cancelled = true)))) {
    expect(d).toBe("1");
    break;
  }
  expect(cancelled).toBe(true);
});
