// The layering rule of the house (ARCHITECTURE.md), checked by `npm run lint:deps` inside
// `npm test`: arrows point one way, from a floor to the floors below it, never back up.
//   floor 6  cli                      wiring: flags, roles, cluster
//   floor 5  gateway                  front door: routing, retries, resume
//   floor 4  http, control            thin adapters over the use cases
//   floor 3  handoff, transfer        one request's hand-off; KV transfer
//   floor 2  rpc, engine              gRPC floor (servers, clients, status); the engine loop
//   floor 1  model, pool, codec, rng, grammar, obs, gen
const CORE = "^src/(codec|rng|pool|model|grammar|engine|obs)/";
const ADAPTERS = ["http", "transfer", "control", "gateway", "handoff", "rpc", "cli"];

/** `from` may not import any of the src/ folders `folders`. */
function forbid(name, from, folders, comment) {
  return { name, severity: "error", comment, from: { path: from }, to: { path: `^src/(${folders.join("|")})/` } };
}

module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "A cycle makes two modules one: split what both need into a module below them. (A cycle through type-only imports is erased at run time and allowed.)",
      from: {},
      to: { circular: true, viaOnly: { dependencyTypesNot: ["type-only"] } },
    },
    {
      name: "core-is-pure",
      severity: "error",
      comment: "codec, rng, pool, model, engine and obs are the pure core: no Connect, no generated code.",
      from: { path: CORE },
      to: { path: ["^node_modules/@connectrpc/", "^src/gen/"] },
    },
    forbid("core-imports-no-adapter", CORE, ADAPTERS, "The pure core never imports an adapter or a use case."),
    forbid("grammar-is-a-leaf", "^src/grammar/", ["codec", "rng", "pool", "model", "engine", "obs"], "src/grammar wraps xgrammar and imports none of ours, so the model thread may use it too."),
    forbid("rpc-is-a-floor", "^src/rpc/", ["transfer", "control", "gateway", "http", "handoff", "cli"], "src/rpc lies below every adapter."),
    forbid("transfer-sides-apart-send", "^src/transfer/send/", ["transfer/receive"], "P's side of a push never imports D's: what both need lives in transfer/wire."),
    forbid("transfer-sides-apart-receive", "^src/transfer/receive/", ["transfer/send"], "D's side of a push never imports P's: what both need lives in transfer/wire."),
    forbid("transfer-wire-is-shared", "^src/transfer/wire/", ["transfer/send", "transfer/receive"], "transfer/wire is below both sides of a push."),
    {
      name: "transfer-through-its-index",
      severity: "error",
      comment: "Outside src/transfer, the room is reached through src/transfer/index.ts; inside it, a side reaches another sub-room through that sub-room's index.",
      from: { path: "^src/", pathNot: "^src/transfer/" },
      to: { path: "^src/transfer/.+/" },
    },
    {
      name: "transfer-sides-use-wire-index",
      severity: "error",
      comment: "send/ and receive/ take what they share from transfer/wire/index.ts.",
      from: { path: "^src/transfer/(send|receive)/" },
      to: { path: "^src/transfer/wire/", pathNot: "^src/transfer/wire/index\\.ts$" },
    },
    forbid("transfer-below-adapters", "^src/transfer/", ["control", "gateway", "http", "handoff", "cli"], "transfer is used by the hand-off and the adapters, never the other way."),
    forbid("handoff-below-adapters", "^src/handoff/", ["control", "gateway", "http", "cli"], "The use cases know no adapter."),
    forbid("adapters-below-gateway", "^src/(http|control)/", ["gateway", "cli"], "Engine adapters never import the gateway or the CLI."),
    forbid("gateway-below-cli", "^src/gateway/", ["cli"], "The gateway never imports the CLI wiring."),
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { extensions: [".ts", ".js", ".mjs", ".json"] },
  },
};
