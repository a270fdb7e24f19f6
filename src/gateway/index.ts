export { WorkerRegistry } from "./worker-registry.ts";
export { RegistryService } from "./registry-service.ts";
export { loadOf, Suspects } from "./router.ts";
export { startGateway, type Gateway, type GatewayOptions } from "./gateway.ts";
export { InFlight, PairPicker, RetryPolicy } from "./pair-picker.ts";
export { PrefixIndex } from "./prefix-index.ts";
