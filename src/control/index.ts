export { serveGrpc, type GrpcServer, type GrpcServerOptions } from "./grpc-server.ts";
export { grpcClient, closeGrpcClients, type GrpcClientOptions } from "./grpc-client.ts";
export {
  workerStatus,
  receivesKv,
  type EngineRole,
  type WorkerIdentity,
  type WorkerLoad,
} from "./worker-status.ts";
export { Heartbeat, beatOnce, newBeatState, type BeatState, type Registry } from "./heartbeat.ts";
export { GrpcRegistry } from "./grpc-registry.ts";
