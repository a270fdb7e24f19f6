// P's side of a push: cut the pool's blocks into chunks and send them over D's data plane or gRPC.
export { buildChunks, PoolChunk, poolChunks } from "./build-chunks.ts";
export { DataPlaneClient } from "./data-plane-client.ts";
export type { KvTransport, PushOptions, PushRoute } from "./kv-transport.ts";
export { RoutingTransport } from "./routing-transport.ts";
export { type TransferStats, transfer } from "./transfer.ts";
