export { serveGrpc, type GrpcServer, type GrpcServerOptions, type PeerCall, type PeerCheck } from "./grpc-server.ts";
export { grpcClient, closeGrpcClients, type GrpcClientOptions } from "./grpc-client.ts";
export { Code, codeName, ConnectError, httpStatusOf, RpcError } from "./status.ts";
