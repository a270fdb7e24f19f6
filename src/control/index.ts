export {
  workerStatus,
  receivesKv,
  type EngineRole,
  type WorkerIdentity,
  type WorkerLoad,
} from "./worker-status.ts";
export { Heartbeat, beatOnce, newBeatState, type BeatState, type Registry } from "./heartbeat.ts";
export { GrpcRegistry } from "./grpc-registry.ts";
export { controlService, samplingFromProto, samplingToProto, type ControlContext } from "./control-service.ts";
