export { serveGrpc, type GrpcServer } from "./grpc-server.ts";
export type { PeerCheck } from "./peer-gate.ts";
export { grpcClient, closeGrpcClients } from "./grpc-client.ts";
