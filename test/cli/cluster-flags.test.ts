import { expect, test } from "bun:test";
import { createServer, type Server } from "node:net";
import { CLUSTER_OPTIONS, clusterFlags } from "../../src/cli/cluster-flags.ts";
import { busyNote, frontDoor } from "../../src/cli/cluster.ts";
import { ConfigError, parseArgs, SPECS } from "../../src/cli/options.ts";
import { spawnProc } from "./procs.ts";

const SAMPLE: Record<string, string> = {
  int: "7",
  uint: "0",
  num: "1.5",
  addr: "127.0.0.1:1234",
  "gateways?": "127.0.0.1:1234,dns:gateways.example:1235",
  "addr?": "127.0.0.1:1234",
  "host?": "10.1.2.3",
  "url?": "http://127.0.0.1:4318",
  string: "x.bin",
  bool: "true",
  list: "key-1",
};
const flagOf = (key: string) => `--${key.replaceAll("_", "-")}`;
/** A valid value for the option `key`: its kind's sample, or the last of its choices. */
function sampleOf(key: string): string {
  const spec = SPECS.find((s) => s.key === key)! as { kind: string; choices?: readonly string[] };
  return spec.kind === "choice" ? spec.choices!.at(-1)! : SAMPLE[spec.kind]!;
}
const keys = [...new Set(SPECS.map((s) => s.key))];

/** What `engine cluster --<key> <value>` does with the option: where it went, or the error. */
function route(key: string): { gateway: string | null; engines: string | null; front: string | null; refused: string | null } {
  // A boolean stands alone on the command line; `--flag=value` says the value outright.
  const { config } = parseArgs([`${flagOf(key)}=${sampleOf(key)}`]);
  try {
    const f = clusterFlags(config);
    const valueIn = (list: string[]) => {
      const joined = list.find((a) => a.startsWith(`${flagOf(key)}=`));
      if (joined !== undefined) return joined.slice(flagOf(key).length + 1);
      const i = list.indexOf(flagOf(key));
      return i < 0 ? null : list[i + 1]!;
    };
    return { gateway: valueIn(f.gateway), engines: valueIn(f.engines), front: f.httpListen ?? f.registryListen, refused: null };
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    return { gateway: null, engines: null, front: null, refused: e.message };
  }
}

test("cluster passes on or refuses every option", () => {
  for (const key of keys) {
    const r = route(key);
    const rule = CLUSTER_OPTIONS[key];
    const value = sampleOf(key);
    if (rule === undefined || typeof rule === "object") {
      // Refused, naming the option, before anything starts.
      expect({ key, refused: r.refused?.startsWith(`${flagOf(key)} is not accepted by engine cluster`) }).toEqual({ key, refused: true });
      continue;
    }
    // Passed on: it reaches exactly the processes the rule names, with its value.
    const reached = { gateway: r.gateway === value || (key.endsWith("_listen") && r.front === value), engines: r.engines === value };
    expect({ key, ...reached }).toEqual({ key, gateway: rule !== "engines", engines: rule !== "gateway" });
  }
});

test("cluster options the issue named reach their processes", () => {
  expect(route("http_listen")).toMatchObject({ front: "127.0.0.1:1234", engines: null, refused: null });
  expect(route("max_batch_tokens")).toMatchObject({ engines: "7", gateway: null, refused: null });
  expect(route("drain_timeout_s")).toMatchObject({ engines: "1.5", gateway: "1.5", refused: null });
  expect(route("grpc_listen").refused).toContain("--grpc-listen");
  expect(route("worker_id").refused).toContain("--worker-id");
});

test("cluster option from the gateway table reaches only the gateway", () => {
  const { config } = parseArgs(["--max-model-len", "512"]);
  config.gateway.max_model_len = 256;
  config.given.add("gateway.max_model_len");
  const f = clusterFlags(config);
  expect(f.gateway.slice(f.gateway.indexOf("--max-model-len"), f.gateway.indexOf("--max-model-len") + 2)).toEqual(["--max-model-len", "256"]);
  expect(f.engines.slice(f.engines.indexOf("--max-model-len"), f.engines.indexOf("--max-model-len") + 2)).toEqual(["--max-model-len", "512"]);
  // Nothing given: only the cluster's own beat interval, no defaults restated.
  expect(clusterFlags(parseArgs([]).config)).toEqual({
    gateway: ["--heartbeat-interval-ms", "1000"],
    engines: ["--heartbeat-interval-ms", "1000"],
    httpListen: null,
    registryListen: null,
  });
});

function hold(): Promise<{ server: Server; port: number }> {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => resolve({ server, port: (server.address() as { port: number }).port }));
  });
}

test("cluster says when its default port was busy", async () => {
  const held = await hold();
  try {
    // Busy: the gateway binds a port the OS picks, and the note names both.
    expect(await frontDoor(null, held.port)).toEqual({ listen: "127.0.0.1:0", busy: held.port });
    expect(busyNote(held.port, "127.0.0.1:41234")).toBe(`port ${held.port} is busy; the gateway listens on 127.0.0.1:41234 instead (--http-listen picks one)`);
    // A port the user asked for is theirs or an error, never silently another.
    await expect(frontDoor(`127.0.0.1:${held.port}`)).rejects.toThrow(`--http-listen 127.0.0.1:${held.port}: cannot listen there`);
  } finally {
    held.server.close();
  }
  expect(await frontDoor(null, held.port)).toEqual({ listen: `127.0.0.1:${held.port}`, busy: null });
  expect(await frontDoor(`127.0.0.1:${held.port}`)).toEqual({ listen: `127.0.0.1:${held.port}`, busy: null });
});

test("cluster refuses an option before starting anything", async () => {
  const p = spawnProc([process.execPath, "bin/engine.ts", "cluster", "--kv-listen", "127.0.0.1:9"]);
  expect(await p.proc.exited).toBe(2);
  expect(p.stderr()).toContain("--kv-listen is not accepted by engine cluster");
  expect(p.lines).toEqual([]);
});
