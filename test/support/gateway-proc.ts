// A gateway replica in a process of its own, for tests that kill it with SIGKILL: the
// fake model's tokenizer, loopback, plaintext. Args: <heartbeat interval ms> [host] [registry port].
// Prints one ready line: {"msg":"ready","http":...,"registry":...,"gateway_id":...}.
import { startGateway } from "../../src/gateway/index.ts";
import { fakeServedModel, GATEWAY_TUNING } from "./nodes.ts";

const [intervalMs = "100", host = "127.0.0.1", registryPort = "0"] = process.argv.slice(2);
const gw = await startGateway({
  ...GATEWAY_TUNING,
  tokenizer: fakeServedModel().tokenizer,
  modelName: "fake",
  maxModelLen: 512,
  host,
  registryPort: Number(registryPort),
  heartbeatIntervalMs: Number(intervalMs),
  routingHeaders: true,
});
console.log(JSON.stringify({ msg: "ready", role: "gateway", http: gw.httpAddress, registry: gw.registryAddress, gateway_id: gw.gatewayId }));
