import { ByteTokenizer } from "../../src/model/index.ts";
import type { ServedModel } from "../../src/cli/engine-node.ts";
import { FakeRunner } from "./fake-runner.ts";

/** The fake model behind a byte tokenizer: fast, and any misplaced KV changes its tokens. */
export function fakeServedModel(): ServedModel {
  const tokenizer = new ByteTokenizer();
  return {
    name: "fake",
    runner: new FakeRunner(tokenizer.vocabSize),
    tokenizer,
    nLayers: 2,
    nKvHeads: 2,
    headDim: 4,
    maxSeqLen: 512,
  };
}

/** Reads an SSE body into its JSON events (the [DONE] marker becomes the string "[DONE]"). */
export async function sseEvents(res: Response): Promise<unknown[]> {
  const text = await res.text();
  return text
    .split("\n\n")
    .filter((b) => b.startsWith("data: "))
    .map((b) => b.slice(6))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}
