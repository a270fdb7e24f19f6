// The layering rule of the house, checked by `npm run lint:deps` inside `npm test`: arrows
// point one way, from a floor to the floors below it, never back up. ARCHITECTURE.md's
// table "folder | imports (of ours) | never imports" is ROOMS below, one rule per row:
// a folder may import its own files and the folders its row names, nothing else of ours.
//   floor 6  cli                      wiring: flags, roles, cluster
//   floor 5  gateway                  front door: routing, retries, resume
//   floor 4  http, control            thin adapters over the use cases
//   floor 3  handoff, transfer        one request's hand-off; KV transfer
//   floor 2  rpc, engine              gRPC floor (servers, clients, status); the engine loop
//   floor 1  model, tokenizer, pool, codec, rng, grammar, obs, gen
//            (inside model: thread -> load -> compute, each entered by its index.ts)
const CORE = "^src/(codec|rng|pool|model|tokenizer|grammar|engine|obs)/";
const BELOW_ADAPTERS = ["codec", "rng", "pool", "tokenizer", "model", "grammar", "obs", "gen", "engine", "rpc", "transfer", "handoff"];

/** Each row of ARCHITECTURE.md's table: the folders of ours a folder may import, and why. */
const ROOMS = [
  [["codec", "rng"], [], "codec and rng are leaves: they import nothing of ours."],
  [["pool"], ["codec"], "The pool imports only codec (block hashes, KV shapes)."],
  [["tokenizer"], ["codec"], "Tokenizers, vocabularies and chat templates: the gateway tokenizes without the model."],
  [["model"], ["codec", "pool", "rng", "grammar", "tokenizer"], "The model thread samples with the engine's sampler (rng) and masks with a structured output's matcher (grammar); a loader builds its file's tokenizer."],
  [["model/compute"], ["codec", "pool"], "The kernels and the transformer know no file format and no thread."],
  [["model/load"], ["model/compute", "codec", "tokenizer"], "Loaders turn a file into the compute's weights and config."],
  [["model/thread"], ["model/compute", "model/load", "codec", "pool", "rng", "grammar"], "The model worker runs a loaded model off the main thread."],
  [["obs"], [], "obs is a leaf: metrics and traces import nothing of ours."],
  [["grammar"], [], "src/grammar wraps xgrammar and imports none of ours, so the model thread may use it too."],
  [["gen"], [], "src/gen is protoc-gen-es output and imports nothing of ours."],
  [["engine"], ["codec", "rng", "pool", "model", "grammar"], "The engine sits on the pure core and knows no adapter."],
  [["rpc"], ["codec"], "src/rpc lies below every adapter: Connect and protobuf, and codec's quote."],
  [["transfer"], ["codec", "pool", "obs", "rpc", "gen"], "transfer is used by the hand-off and the adapters, never the other way."],
  [["transfer/wire"], ["codec", "rpc"], "The wire (chunks, frames, errors) is shared by both sides and knows neither."],
  [["transfer/send"], ["transfer/wire", "codec", "pool", "obs", "rpc", "gen"], "The sending side (P) knows the wire, not the receiver."],
  [["transfer/receive"], ["transfer/wire", "codec", "pool", "obs", "rpc", "gen"], "The receiving side (D) knows the wire, not the sender."],
  [["handoff"], ["engine", "transfer", "codec", "obs", "rpc", "grammar"], "The use cases know no adapter."],
  [["http", "control"], BELOW_ADAPTERS.filter((f) => f !== "model"), "Engine adapters never import the gateway or the CLI, nor each other; they tokenize through src/tokenizer, not the model."],
  [["gateway"], [...BELOW_ADAPTERS, "http", "control"], "The gateway never imports the CLI wiring."],
];

/** One forbidden rule: `folders` may import their own files and `allowed`, nothing else under src/. */
function room([folders, allowed, comment]) {
  return {
    name: `room-${folders.join("-").replace("/", "-")}`,
    severity: "error",
    comment,
    from: { path: `^src/(${folders.join("|")})/` },
    to: { path: "^src/", pathNot: [`^src/$1/`, ...allowed.map((f) => `^src/${f}/`)] },
  };
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
      comment: "codec, rng, pool, model, grammar, engine and obs are the pure core: no Connect, no generated code.",
      from: { path: CORE },
      to: { path: ["^node_modules/@connectrpc/", "^src/gen/"] },
    },
    ...ROOMS.map(room),
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
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { extensions: [".ts", ".js", ".mjs", ".json"] },
  },
};
