export { KvPool, type KvPoolOptions } from "./kv-pool.ts";
