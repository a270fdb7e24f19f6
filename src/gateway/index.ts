export { WorkerRegistry, type WorkerRegistryOptions, type WorkerView } from "./worker-registry.ts";
export { RegistryService, type RegistryServiceOptions } from "./registry-service.ts";
export { type CostWeights, loadOf, pickByLoad, pickDecode, type DecodePick, type Pick, Suspects } from "./router.ts";
export { startGateway, type Gateway, type GatewayOptions } from "./gateway.ts";
export { Admission } from "./admission.ts";
export { InFlight, PairPicker, RetryPolicy, type Pair, type Reserved, type RetryDecision } from "./pair-picker.ts";
export { PrefillClient } from "./prefill-client.ts";
export { Completions } from "./completions.ts";
export { PrefixIndex, type PrefixIndexOptions, type EventsAnswer } from "./prefix-index.ts";
