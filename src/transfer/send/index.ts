// P's side of a push: cut the pool's blocks into chunks and send them over gRPC or D's data plane.
export { buildChunks, chunkSlabBytes, PoolChunk, poolChunks } from "./build-chunks.ts";
export { DataPlaneClient, type DataPlaneClientOptions } from "./data-plane-client.ts";
export type { BlockPresence, KvTransport, PushOptions, PushRoute } from "./kv-transport.ts";
export { RoutingTransport, type RoutingTransportOptions } from "./routing-transport.ts";
export { type TransferStats, transfer } from "./transfer.ts";
