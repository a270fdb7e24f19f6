export { serveGrpc, type GrpcServer, type GrpcServerOptions } from "./grpc-server.ts";
export type { PeerCall, PeerCheck } from "./peer-gate.ts";
export { grpcClient, closeGrpcClients, type GrpcClientOptions } from "./grpc-client.ts";
export { Code, codeName, ConnectError, httpStatusOf, RpcError } from "./status.ts";
