export { WorkerRegistry, type WorkerRegistryOptions, type WorkerView } from "./worker-registry.ts";
export { RegistryService, type RegistryServiceOptions } from "./registry-service.ts";
export { KvAffinity, pickByLoad, pickDecode, type Pick } from "./router.ts";
export { startGateway, type Gateway, type GatewayOptions } from "./gateway.ts";
