export { KvPool, type KvPoolOptions, type KvPoolWatcher } from "./kv-pool.ts";
export { KvEventLog, type KvEventSlice } from "./kv-event-log.ts";
