export * from "./receive/index.ts";
export * from "./send/index.ts";
export { KvError, type KvAckLike, type KvChunkLike, TransferError } from "./wire/index.ts";
export { KV_FORMAT } from "../codec/index.ts";
