export { fnv1a64, blockHash, promptHashes } from "./fnv1a64.ts";
export { getU16, getU32, getU64, putU16, putU32, putU64 } from "./bytes.ts";
export {
  crc32c,
  crc32cTable,
  crc32cNative,
  crc32cNodeRs,
  crc32cBackend,
  crc32cCombine,
  crc32cCombineOp,
  crc32cCombineWith,
  crc32cExtendU32,
} from "./crc32c.ts";
export { toF16Bits, fromF16Bits, roundF16, f16Bytes } from "./f16.ts";
export { quote, QUOTE_MAX } from "./quote.ts";
export { writeEnvelope, readEnvelope, verifyEnvelope, envelopeRecordAt, chunkRecordHash, type EnvelopeHeader, type EnvelopeRecord } from "./envelope.ts";
export { EnvError, hex32, hex64, grpcCodeOf, grpcCodeNameOf, type EnvErrorKind } from "./env-error.ts";
export { ENVELOPE_HEAD_BYTES, EnvelopeCrc, envelopeHeadCrc, joinEnvelope, OneBlockEnvelopeWriter, oneBlockRecord, oneBlockRecordParts } from "./one-block.ts";
export { blockPayloadBytes, envelopeBytes, KV_FORMAT, type KvShape } from "./kv-shape.ts";
