export {
  workerStatus,
  receivesKv,
  type EngineRole,
  type WorkerIdentity,
  type WorkerLoad,
} from "./worker-status.ts";
export { Heartbeat, beatOnce, newBeatState, type BeatState, type HeartbeatExtras, type Registry } from "./heartbeat.ts";
export { KvEventFeed, MAX_EVENT_HASHES_PER_BEAT, type KvEventSource } from "./kv-event-feed.ts";
export {
  GatewayBeats,
  MAX_GATEWAYS,
  parseRegistryTargets,
  systemResolver,
  type GatewayBeatsOptions,
  type RegistryTarget,
  type Resolver,
} from "./gateway-beats.ts";
export { GrpcRegistry } from "./grpc-registry.ts";
export { controlService, samplingFromProto, samplingToProto, type ControlContext } from "./control-service.ts";
