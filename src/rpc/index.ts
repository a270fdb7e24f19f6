export { serveGrpc, type GrpcServer, type GrpcServerOptions } from "./grpc-server.ts";
export type { PeerCall, PeerCheck } from "./peer-gate.ts";
export { grpcClient, closeGrpcClients, type GrpcClientOptions } from "./grpc-client.ts";
export { Code, codeName, codeOfHttpStatus, httpStatusOf } from "./status.ts";
export { GRPC_PREFIX_BYTES, grpcMessageLength, grpcStatusOf, putGrpcPrefix, sendGrpcStatus } from "./grpc-wire.ts";
