// src/model/thread: the model thread and the port the engine drives it through. What other rooms use.
export { dropFirst } from "./drop-first.ts";
export { LogitsRows } from "./logits-rows.ts";
export { prevToken, type RowSampling, SAMPLE_FAILED } from "./model-worker-protocol.ts";
export { type ForwardDone, ModelWorker } from "./model-worker.ts";
