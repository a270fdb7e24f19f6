// D's side of a push: every server path drives one PushDriver over the KvReceiver.
export { serveDataPlane, type DataPlaneServer } from "./data-plane-server.ts";
export { type ClaimedHandle, KvReceiver, type KvReceiverOptions, MAX_OWNER_CHARS, PushSession } from "./kv-receiver.ts";
export { type KvServer, type ServeKvOptions, serveKv } from "./kv-server.ts";
export { kvMessageLimit, kvService, type KvServiceOptions } from "./kv-service.ts";
export { acceptAll, PushDriver, toKvError } from "./push-driver.ts";
