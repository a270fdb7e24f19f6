// The public library API of tl-engine.
export {
  fnv1a64,
  blockHash,
  promptHashes,
  crc32c,
  writeEnvelope,
  readEnvelope,
  EnvError,
  grpcCodeOf,
  blockPayloadBytes,
  envelopeBytes,
  type EnvelopeHeader,
  type EnvelopeRecord,
  type EnvErrorKind,
  type KvShape,
} from "./codec/index.ts";
export { Pcg32, stream, resumeRng, sample, type SamplingConfig } from "./rng/index.ts";
export { KvPool } from "./pool/index.ts";
export { Engine, type EngineOptions, type EngineRequest, type ModelPort, type SeqChunk, type Finish, type SamplingParams } from "./engine/index.ts";
export { Transformer, loadSyntheticModel, loadLlama2cCheckpoint, type ModelConfig } from "./model/index.ts";
export { loadLlama2cTokenizer, ByteTokenizer, type Tokenizer } from "./tokenizer/index.ts";
export { KvReceiver, serveKv, RoutingTransport, transfer, TransferError, KvError, type KvTransport, type TransferStats } from "./transfer/index.ts";
export { Heartbeat, GrpcRegistry } from "./control/index.ts";
export { serveGrpc, grpcClient, Code } from "./rpc/index.ts";
export { controlService, samplingFromProto } from "./control/control-service.ts";
export { startEngineNode, type EngineNode, type EngineNodeOptions } from "./cli/engine-node.ts";
export { startGateway, WorkerRegistry, type Gateway, type GatewayOptions } from "./gateway/index.ts";
