import { log } from "../obs/index.ts";
import type { ToolParserName } from "../http/index.ts";
import { receivesKv, type EngineRole, type GatewayBeats, type Resolver, type WorkerIdentity } from "../control/index.ts";
import { serveGrpc } from "../rpc/index.ts";
import { controlService, type ControlContext } from "../control/control-service.ts";
import { Engine, type ModelPort, transformerPort, WorkerPort } from "../engine/index.ts";
import { EngineControl } from "../gen/tl/engine/v1/engine_pb.ts";
import type { TlsSource } from "../rpc/tls-config.ts";
import { engineHttpHandler, serveHttp, type HttpListenerOptions, type RequestEnd } from "../http/index.ts";
import {
  holdWeights,
  kvShapeOf,
  loadTokenizerFor,
  servingEosIds,
  ModelWorker,
  weightsBytes,
  loadModel as loadModelFiles,
  Transformer,
  type DType,
  type KvPoolSize,
  type KvSlab,
  type LoadModelOptions,
  type ModelConfig,
  type ServableModel,
  type WeightStats,
} from "../model/index.ts";
import { chatRendererFor, tokenizerFingerprint, type Tokenizer } from "../tokenizer/index.ts";
import { KvEventLog, KvPool } from "../pool/index.ts";
import { RoutingTransport, type KvReceiver } from "../transfer/index.ts";
import { blockPayloadBytes, type KvShape } from "../codec/index.ts";
import { ConfigError, ENGINE_DEFAULTS } from "./options.ts";
import { httpListener } from "./security.ts";
import { Closers } from "./closers.ts";
import { startKvSide } from "./node-kv-side.ts";
import { startNodeBeats } from "./node-beats.ts";

/** A model ready to serve: what forward needs, how text maps to tokens, the KV shape per layer. */
export interface ServedModel {
  name: string;
  runner: ModelPort;
  tokenizer: Tokenizer;
  nLayers: number;
  nKvHeads: number;
  headDim: number;
  maxSeqLen: number;
  /** Ids that end generation (several for Llama 3); default: the tokenizer's EOS. */
  eosIds?: readonly number[];
  /** Parameter count, stored dtype and resident bytes, for the ready line and /v1/models. */
  stats?: WeightStats;
  chatTemplate?: string | null;
  /** How the weights are held in memory, and the threads the model runs on (for the ready line). */
  dtype?: string;
  threads?: number;
  /** What runs the matmuls: "wasm-simd", or "plain-js (why)". */
  kernels?: string;
  /** Kernel memories the weights are spread over: 1 unless the model outgrows a wasm32 memory. */
  memories?: number;
  /** Whether the kernel memories are on 2 MiB pages (huge-pages.ts). */
  hugePages?: boolean;
  /** Settles when the model's threads run. */
  ready?: () => Promise<void>;
  /** Stops the model's helper threads. */
  close?: () => void;
  /** The model runs on another thread over the KV slab: the pool must be made shared. */
  sharedSlab?: boolean;
  /** Room for the KV slab in the model kernels' memory, where attention reads it in place (kvPoolFor). */
  kvSlab?: (bytes: number) => Promise<KvSlab[] | null>;
  /** Calls `listener` if the model's thread dies (every forward fails from then on). */
  onDeath?: (listener: (e: Error) => void) => void;
}

export interface EngineNodeOptions {
  role: EngineRole;
  workerId?: string;
  host?: string;
  /** Host the gateway and peers reach this engine at (a pod IP); default: `host`. */
  advertiseHost?: string;
  httpPort?: number;
  grpcPort?: number;
  kvPort?: number;
  /** The binary data plane's port; 0 (default): the OS picks. */
  kvDataPort?: number;
  /** A model given directly (tests), else loaded from modelPath/tokenizerPath, else the embedded one. */
  model?: ServedModel;
  modelPath?: string;
  tokenizerPath?: string;
  dtype?: ModelOptions["dtype"];
  threads?: number;
  hugePages?: boolean;
  modelThread?: ModelOptions["modelThread"];
  /** Bytes of weights one kernel memory may place (ModelOptions.groupBytes): tests lower it. */
  groupBytes?: ModelOptions["groupBytes"];
  /** What /v1/models lists and requests must name; default the model's folder or file name. */
  servedModelName?: string;
  /** A Jinja chat template file overriding the model's (--chat-template). */
  chatTemplatePath?: string;
  /** --tool-call-parser: how tool_choice "auto" reads calls; default: what the chat template shows. */
  toolCallParser?: ToolParserName | null;
  blockTokens?: number;
  numBlocks?: number;
  maxModelLen?: number;
  maxBatchTokens?: number;
  handleTtlS?: number;
  /** Decode side: a push silent this long is aborted and freed. Left out, any option here is its SPECS default. */
  pushIdleTimeoutMs?: number;
  /**
   * The gateways' WorkerRegistry: a comma-separated list of host:port and dns:host:port (a
   * name re-resolved every interval to all its addresses); one heartbeat loop per address.
   * No heartbeat without it.
   */
  gatewayRegistry?: string;
  /** Resolves dns: entries of gatewayRegistry (tests inject one); default the system's. */
  resolver?: Resolver;
  /** Report the KV pool's stored and evicted blocks in every beat (roles that receive KV; default true). */
  kvEvents?: boolean;
  heartbeatIntervalMs?: number;
  heartbeatTimeoutMs?: number;
  /** Prefill side: push over the binary data plane when the decode engine offers one. */
  useDataPlane?: boolean;
  /** Decode side: offer the binary data plane beside gRPC. */
  offerDataPlane?: boolean;
  /** Decode side: the KvTransfer host:port heartbeats advertise, when peers reach it through a proxy or NAT (default: its own). */
  advertiseKvAddress?: string;
  onRequestEnd?: (info: RequestEnd) => void;
  extraRoutes?: (req: Request, url: URL) => Promise<Response | null> | Response | null;
  /** API keys, the body bound and the slow-client bounds of the engine's own HTTP port (maxRequestBytes: max_request_bytes unless given). */
  frontDoor?: Partial<HttpListenerOptions>;
  /** Mutual TLS on EngineControl, KvTransfer and the data plane, and toward the gateway and decode engines. */
  tls?: TlsSource | null;
  onTransfer?: ControlContext["onTransfer"];
  /** A pushed handle nobody claimed or released was freed by its time to live. */
  onHandleExpired?: (handleId: string) => void;
}

export interface EngineNode {
  readonly workerId: string;
  readonly role: EngineRole;
  readonly httpAddress: string;
  readonly grpcAddress: string;
  /** "" unless the role receives KV */
  readonly kvAddress: string;
  readonly engine: Engine;
  readonly pool: KvPool;
  /** Whether the pool is in the model kernels' memories, read in place (else a slab of its own, whose layers attention copies). */
  readonly kvInKernel: boolean;
  readonly receiver: KvReceiver | null;
  readonly model: ServedModel;
  /** The beats to every gateway replica. */
  readonly heartbeat: GatewayBeats | null;
  /** The pool's KV events, reported to the gateways (roles that receive KV). */
  readonly kvEvents: KvEventLog | null;
  /** The values this engine runs with: the caller's, else the option's default (SPECS). */
  readonly effective: EffectiveOptions;
  /** Stops admitting, waits for in-flight work up to the deadline, then stops every server. */
  shutdown(deadlineMs?: number): Promise<number>;
}

export interface ModelOptions {
  /** Weights in memory (default: as stored). */
  dtype?: DType | "as-stored";
  /** Threads the matmuls split over (default: the threads option's, all cores). */
  threads?: number;
  /** false: kernel memory stays on 4 KiB pages (KernelOptions.hugePages; default: 2 MiB where the host gives them). */
  hugePages?: boolean;
  /** Where forwards run: a model thread of their own (default), or the engine's event loop. */
  modelThread?: "worker" | "main";
  /** Bytes of weights one kernel memory may place (TransformerOptions.groupBytes): tests lower it. */
  groupBytes?: number;
  /** The KV pool the engine will build over the model: kernel memories keep room for it (TransformerOptions.kvPool). */
  kvPool?: KvPoolSize;
}

/** Loads the model `--model` names (any supported format; none: the embedded one) and wraps it for the engine. */
export async function loadModel(given: LoadModelOptions & ModelOptions): Promise<ServedModel> {
  // Left out: the [engine] option's default (all cores, a model thread of its own).
  const opts = {
    ...given,
    threads: given.threads ?? ENGINE_DEFAULTS.threads,
    modelThread: given.modelThread ?? ENGINE_DEFAULTS.model_thread,
  };
  if (opts.modelThread === "worker") return loadModelThread(opts);
  const m = servedModelOf(await loadModelFiles(opts), opts);
  await m.ready?.();
  return m;
}

/**
 * The model on a thread of its own, which loads the weights itself: this thread holds only the
 * tokenizer and config, and its event loop never waits behind a forward.
 */
async function loadModelThread(opts: LoadModelOptions & ModelOptions & { threads: number }): Promise<ServedModel> {
  const { modelPath, tokenizerPath, maxSeqLen, dtype, threads, hugePages, groupBytes, kvPool } = opts;
  const started = ModelWorker.start({ modelPath, tokenizerPath, maxSeqLen, dtype, threads, hugePages, groupBytes, kvPool });
  // A bad path or tokenizer is told by the tokenizer's load, in the same words as in-thread.
  const tok = await loadTokenizerFor(opts).catch((e: unknown) => {
    void started.then(
      (w) => w.close(),
      () => {},
    );
    throw e;
  });
  const w = await started;
  const cfg: ModelConfig = w.info.cfg;
  let eosIds: number[];
  try {
    eosIds = servingEosIds(w.info.name, tok.tokenizer, cfg.vocabSize, w.info.eosIds);
  } catch (e) {
    w.close();
    throw e;
  }
  const shape = kvShapeOf(cfg, 1);
  return {
    name: opts.servedModelName || w.info.name,
    runner: new WorkerPort(w),
    tokenizer: tok.tokenizer,
    nLayers: shape.nLayers,
    nKvHeads: shape.nKvHeads,
    headDim: shape.headDim,
    maxSeqLen: cfg.maxSeqLen,
    eosIds,
    stats: w.info.stats,
    chatTemplate: tok.chatTemplate,
    dtype: w.info.dtype,
    threads: w.info.threads,
    kernels: w.info.kernels,
    memories: w.info.memories,
    hugePages: w.info.hugePages,
    close: () => w.close(),
    sharedSlab: true,
    kvSlab: (bytes) => w.kvSlab(bytes),
    onDeath: (listener) => w.onDeath(listener),
  };
}

/** A loaded model behind a Transformer, as the engine runs it. */
export function servedModelOf(
  m: Pick<ServableModel, "name" | "cfg" | "weights" | "tokenizer" | "eosIds" | "stats" | "chatTemplate">,
  opts: ModelOptions & { threads: number },
): ServedModel {
  const weights = holdWeights(m.cfg, m.weights, m.stats.dtype, opts.dtype);
  const t = new Transformer(m.cfg, weights, { threads: opts.threads, groupBytes: opts.groupBytes, hugePages: opts.hugePages, kvPool: opts.kvPool });
  const shape = kvShapeOf(t.cfg, 1);
  return {
    name: m.name,
    runner: transformerPort(t),
    tokenizer: m.tokenizer,
    nLayers: shape.nLayers,
    nKvHeads: shape.nKvHeads,
    headDim: shape.headDim,
    maxSeqLen: t.cfg.maxSeqLen,
    eosIds: m.eosIds,
    stats: { ...m.stats, residentBytes: weightsBytes(weights) },
    chatTemplate: m.chatTemplate,
    dtype: t.dtype,
    threads: t.threads,
    kernels: t.kernels,
    memories: t.memories,
    hugePages: t.hugePages,
    ready: () => t.ready(),
    close: () => t.close(),
    kvSlab: async (bytes) => t.kvSlab(bytes),
  };
}

/** The engine's KV pool: in the model kernels' memory when the model has room (attention reads it in place), else a slab of its own. */
export async function kvPoolFor(model: ServedModel, shape: KvShape, numBlocks: number): Promise<KvPool> {
  return (await kvPoolPlaced(model, shape, numBlocks)).pool;
}

/** kvPoolFor, and whether the pool is in the model kernels' memories (else a slab of its own, whose layers attention copies). */
async function kvPoolPlaced(model: ServedModel, shape: KvShape, numBlocks: number): Promise<{ pool: KvPool; inKernel: boolean }> {
  const bytes = numBlocks * blockPayloadBytes(shape);
  const rooms = (await model.kvSlab?.(bytes)) ?? null;
  if (rooms !== null) return { pool: new KvPool(shape, numBlocks, { segments: rooms }), inKernel: true };
  if (bytes > MAX_KV_POOL_BYTES) {
    const most = Math.floor(MAX_KV_POOL_BYTES / blockPayloadBytes(shape));
    throw new ConfigError(
      `--num-blocks ${numBlocks}: a KV pool of ${(bytes / 2 ** 30).toFixed(2)} GiB (${blockPayloadBytes(shape)} bytes a block for this model) is past the 4 GiB one buffer holds, and the model's kernel memories have no room for it; at most ${most} blocks`,
    );
  }
  return { pool: new KvPool(shape, numBlocks, { shared: model.sharedSlab === true }), inKernel: false };
}

/** One ArrayBuffer holds at most 4 GiB in Bun (a larger one throws "Out of memory"), and a pool outside the kernel memories is one. */
const MAX_KV_POOL_BYTES = 2 ** 32;

let nodeCounter = 0;
const CONTROL_MESSAGE_BYTES = 4 * 1024 * 1024;
const STREAM_SETTLE_MS = 50;

/** The tuning an engine node runs with, each the caller's value or its [engine] option's default. */
export interface EffectiveOptions {
  blockTokens: number;
  numBlocks: number;
  /** At most the model's context; max_model_len 0 (the default) or none: the context. */
  maxModelLen: number;
  maxBatchTokens: number;
  handleTtlS: number;
  pushIdleTimeoutMs: number;
  heartbeatIntervalMs: number;
  heartbeatTimeoutMs: number;
  maxRequestBytes: number;
}

/** The KV pool's block size and count, the caller's or the defaults (what the model's memories keep room for). */
function kvPoolSize(opts: EngineNodeOptions): KvPoolSize {
  return { blockTokens: opts.blockTokens ?? ENGINE_DEFAULTS.block_tokens, numBlocks: opts.numBlocks ?? ENGINE_DEFAULTS.num_blocks };
}

/** Every value a caller leaves out is its option's default: SPECS holds each one (ENGINE_DEFAULTS), nothing here. */
function effectiveOptions(opts: EngineNodeOptions, context: number): EffectiveOptions {
  const D = ENGINE_DEFAULTS;
  return {
    ...kvPoolSize(opts),
    maxModelLen: Math.min(opts.maxModelLen || D.max_model_len || context, context),
    maxBatchTokens: opts.maxBatchTokens ?? D.max_batch_tokens,
    handleTtlS: opts.handleTtlS ?? D.handle_ttl_s,
    pushIdleTimeoutMs: opts.pushIdleTimeoutMs ?? D.push_idle_timeout_ms,
    heartbeatIntervalMs: opts.heartbeatIntervalMs ?? D.heartbeat_interval_ms,
    heartbeatTimeoutMs: opts.heartbeatTimeoutMs ?? D.heartbeat_timeout_ms,
    maxRequestBytes: opts.frontDoor?.maxRequestBytes ?? D.max_request_bytes,
  };
}

/** Starts one engine process's servers: KvTransfer (decode roles), EngineControl, HTTP, beats to the gateways. */
export async function startEngineNode(opts: EngineNodeOptions): Promise<EngineNode> {
  const { role } = opts;
  const host = opts.host ?? "127.0.0.1";
  const tls = opts.tls ?? null;
  const workerId = opts.workerId ?? `${role}-${process.pid}-${nodeCounter++}`;
  const model = opts.model ?? (await loadModel({ ...opts, maxSeqLen: opts.maxModelLen, kvPool: kvPoolSize(opts) }));
  const effective = effectiveOptions(opts, model.maxSeqLen);
  const { pool, kvInKernel, engine } = await engineOver(model, effective);
  const roles: ("prefill" | "decode")[] = role === "both" ? ["prefill", "decode"] : [role];
  // What EngineControl and HTTP both say of this engine. The fingerprint goes to the gateway
  // (beats) and peers (Info): a gateway refuses an engine that tokenizes differently.
  const fingerprint = tokenizerFingerprint(model.tokenizer);
  const served = { workerId, roles, modelName: model.name, engine, tokenizer: model.tokenizer, modelStats: model.stats };
  const advertised = advertiseAt(opts.advertiseHost);
  const closers = new Closers();
  try {
    const kvSide = receivesKv(role) ? await startKvSide({ ...opts, ...effective, pool, host, tls, advertised }, closers) : null;
    const receiver = kvSide?.receiver ?? null;
    const transport = roles.includes("prefill")
      ? new RoutingTransport({ ...(opts.useDataPlane === false ? { dataPlane: false as const } : {}), ...(tls ? { tls } : {}) })
      : null;
    if (transport) closers.add(() => transport.close());
    const control = controlService({ ...served, tokenizerFingerprint: fingerprint, transport, onTransfer: opts.onTransfer });
    // A PrefillRequest is a prompt of at most max_model_len tokens plus sampling: 4 MiB is ample.
    const grpc = await serveGrpc((r) => r.service(EngineControl, control), { host, port: opts.grpcPort ?? 0, tls, maxMessageBytes: CONTROL_MESSAGE_BYTES });
    closers.add(() => grpc.close());
    const http = await serveHttp(
      engineHttpHandler({
        ...served,
        chat: chatRendererFor(model.tokenizer, model.chatTemplate ?? null, opts.chatTemplatePath),
        toolParser: opts.toolCallParser ?? null,
        isDraining: () => engine.isDraining,
        tls: tls === null ? "plaintext" : "mtls",
        receiver,
        onRequestEnd: opts.onRequestEnd,
        extraRoutes: opts.extraRoutes,
      }),
      { ...httpListener(ENGINE_DEFAULTS), ...opts.frontDoor, maxRequestBytes: effective.maxRequestBytes, host, port: opts.httpPort ?? 0 },
    );
    closers.add(() => http.stop());
    // What the gateways route on: the blocks this engine actually holds (a prefill-only engine's
    // cache is never a decode target, so it reports nothing).
    const kvEvents = receivesKv(role) && opts.kvEvents !== false ? KvEventLog.watching(pool) : null;
    if (kvEvents) closers.add(async () => pool.watch(null));
    const kvAddress = kvSide ? (opts.advertiseKvAddress ?? advertised(kvSide.kv.address)) : "";
    const addresses = { httpAddress: advertised(http.address), grpcAddress: advertised(grpc.address), kvAddress };
    const identity: WorkerIdentity = { workerId, role, ...addresses, ...identityOf(model, pool, fingerprint) };
    const beats = {
      ...opts,
      gatewayRegistry: opts.gatewayRegistry ?? "",
      tls,
      intervalMs: effective.heartbeatIntervalMs,
      timeoutMs: effective.heartbeatTimeoutMs,
    };
    const heartbeat = opts.gatewayRegistry ? await startNodeBeats({ ...beats, identity, engine, pool, receiver, kvEvents }, closers) : null;
    // Every forward fails from now on: stop taking requests and tell the gateway at once.
    model.onDeath?.((e) => {
      log.error("model thread died", { worker_id: workerId, error: e.message });
      void engine.drain(0);
      heartbeat?.beatNow();
    });
    const node = {
      workerId,
      role,
      httpAddress: http.address,
      grpcAddress: grpc.address,
      kvAddress: kvSide?.kv.address ?? "",
      engine,
      pool,
      kvInKernel,
      receiver,
      model,
      heartbeat,
      kvEvents,
      effective,
    };
    return { ...node, shutdown: once((deadlineMs = 0) => shutdownNode(node, closers, opts.model === undefined, deadlineMs)) };
  } catch (e) {
    await closers.closeAll();
    if (opts.model === undefined) model.close?.();
    throw e;
  }
}

/** The KV pool and the engine over `model`, sized as `effective` says. */
async function engineOver(model: ServedModel, effective: EffectiveOptions): Promise<{ pool: KvPool; kvInKernel: boolean; engine: Engine }> {
  const shape: KvShape = { blockTokens: effective.blockTokens, nLayers: model.nLayers, nKvHeads: model.nKvHeads, headDim: model.headDim };
  const { pool, inKernel } = await kvPoolPlaced(model, shape, effective.numBlocks);
  const eosTokenIds = model.eosIds ?? model.tokenizer.eosIds;
  const engine = new Engine({ model: model.runner, pool, maxModelLen: effective.maxModelLen, maxBatchTokens: effective.maxBatchTokens, eosTokenIds });
  return { pool, kvInKernel: inKernel, engine };
}

/** What a beat says of the model and pool behind an engine: a gateway routes only to engines that agree. */
function identityOf(model: ServedModel, pool: KvPool, fingerprint: string) {
  return {
    model: model.name,
    blockTokens: pool.shape.blockTokens,
    totalBlocks: pool.total,
    vocabSize: model.tokenizer.vocabSize,
    tokenizerFingerprint: fingerprint,
    ...(model.stats ? { modelStats: model.stats } : {}),
  };
}

/** An address as peers reach it: the advertised host (when there is one) with the bound port. */
function advertiseAt(host: string | undefined): (address: string) => string {
  return (address) => {
    if (!host || address === "") return address;
    return `${host.includes(":") ? `[${host}]` : host}:${address.slice(address.lastIndexOf(":") + 1)}`;
  };
}

/** Drains up to the deadline, cuts what is left, stops every server; returns how many were still running at the deadline. */
async function shutdownNode(node: Omit<EngineNode, "shutdown">, closers: Closers, ownsModel: boolean, deadlineMs: number): Promise<number> {
  const { engine, heartbeat, model } = node;
  const draining = engine.drain(deadlineMs);
  // Tell the gateway now rather than on the next scheduled beat.
  heartbeat?.beatNow();
  const remaining = await draining;
  const cut = engine.requestIds();
  for (const id of cut) engine.cancel(id);
  // A cancelled stream writes its error event on the next turns of the event loop, and
  // stopping HTTP cuts open connections: without this pause clients see a bare reset.
  if (cut.length > 0) await Bun.sleep(STREAM_SETTLE_MS);
  await closers.closeAll();
  // A model this node loaded is its own; one handed in may serve other nodes.
  if (ownsModel) model.close?.();
  return remaining;
}

/** `f` run once: every later call gets the first call's promise. */
function once<A extends unknown[], T>(f: (...args: A) => Promise<T>): (...args: A) => Promise<T> {
  let first: Promise<T> | null = null;
  return (...args) => (first ??= f(...args));
}
