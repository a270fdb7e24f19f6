export { KvPool, type KvSegment, type KvSegmentRoom } from "./kv-pool.ts";
export { KvEventLog, type KvEventSlice } from "./kv-event-log.ts";
