export { KvPool } from "./kv-pool.ts";
