// KV transfer between engines, by side (ARCHITECTURE.md): send/ on P, receive/ on D,
// wire/ what both speak. The one door into the room.
export * from "./receive/index.ts";
export * from "./send/index.ts";
export { KvError, type KvChunkLike, TransferError } from "./wire/index.ts";
export { KV_FORMAT } from "../codec/index.ts";
