// The layering rule of the house (ARCHITECTURE.md), checked by `npm run lint:deps` inside
// `npm test`: arrows point one way, from a floor to the floors below it, never back up.
//   floor 6  cli                      wiring: flags, roles, cluster
//   floor 5  gateway                  front door: routing, retries, resume
//   floor 4  http, control            thin adapters over the use cases
//   floor 3  handoff, transfer        one request's hand-off; KV transfer
//   floor 2  rpc, engine              gRPC floor (servers, clients, status); the engine loop
//   floor 1  model, tokenizer, pool, codec, rng, grammar, obs, gen
//            (inside model: thread -> load -> compute, each entered by its index.ts)
const CORE = "^src/(codec|rng|pool|model|tokenizer|grammar|engine|obs)/";
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
      comment:
        "A cycle makes two modules one: split what both need into a module below them. A cycle through type-only imports counts too (erased at run time, it still ties the two files' reasons to change): move the type to the module that owns it.",
      from: {},
      to: { circular: true },
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
    forbid(
      "tokenizer-is-a-leaf",
      "^src/tokenizer/",
      ["rng", "pool", "model", "grammar", "engine", "obs", "gen", ...ADAPTERS],
      "src/tokenizer (text <-> ids, chat templates) imports only codec, so the gateway and http tokenize without the model.",
    ),
    forbid("model-compute-is-the-floor", "^src/model/compute/", ["model/load", "model/thread", "tokenizer", "grammar", "rng", "engine"], "The forward pass knows no file format, tokenizer, thread or sampler."),
    forbid("model-load-below-thread", "^src/model/load/", ["model/thread", "grammar", "rng", "pool", "engine"], "Loading reads files into compute's types; it never reaches the model thread."),
    {
      name: "model-rooms-meet-at-their-index",
      severity: "error",
      comment: "Inside src/model, a room (load, compute, thread) enters another only through that room's index.ts.",
      from: { path: "^src/model/(load|compute|thread)/" },
      to: { path: "^src/model/(load|compute|thread)/", pathNot: ["^src/model/$1/", "^src/model/(load|compute|thread)/index\\.ts$"] },
    },
    {
      name: "model-and-tokenizer-through-their-index",
      severity: "error",
      comment: "Outside src/model and src/tokenizer, code imports src/model/index.ts and src/tokenizer/index.ts, never a file behind them.",
      from: { pathNot: "^src/(model|tokenizer)/" },
      to: { path: "^src/(model/.+|tokenizer/.+)", pathNot: "^src/(model|tokenizer)/index\\.ts$" },
    },
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
