export { KvPool } from "./kv-pool.ts";
export { KvEventLog, type KvEventSlice } from "./kv-event-log.ts";
