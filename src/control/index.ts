export { workerStatus, receivesKv, type EngineRole, type WorkerIdentity, type WorkerLoad } from "./worker-status.ts";
export { Heartbeat, beatOnce, newBeatState, type Registry } from "./heartbeat.ts";
export { KvEventFeed } from "./kv-event-feed.ts";
export { GatewayBeats, parseRegistryTargets, type Resolver } from "./gateway-beats.ts";
export { GrpcRegistry } from "./grpc-registry.ts";
export { samplingToProto } from "./control-service.ts";
