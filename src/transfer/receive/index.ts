// D's side of a push: both server paths drive one PushDriver over the KvReceiver.
export { serveDataPlane, type DataPlaneServer } from "./data-plane-server.ts";
export { type ClaimedHandle, KvReceiver, type KvReceiverOptions, MAX_OWNER_CHARS, PushSession } from "./kv-receiver.ts";
export { type KvServer, serveKv } from "./kv-server.ts";
export { kvMessageLimit } from "./kv-service.ts";
export { acceptAll, PushDriver } from "./push-driver.ts";
