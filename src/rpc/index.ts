export { serveGrpc, type GrpcServer, type PeerCheck } from "./grpc-server.ts";
export { grpcClient, closeGrpcClients } from "./grpc-client.ts";
