import { afterAll, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { parseAllDocuments } from "yaml";
import { GATEWAY_CONFIG_DEFAULTS, parseAddr, parseArgs, type Config } from "../../src/cli/options.ts";
import { neverDisaggregates } from "../../src/cli/run-engine.ts";
import { REPO, tempDir } from "./procs.ts";

// The manifests are only as good as their agreement with the binary: every container's
// args must be what `engine` accepts, and every port the config binds must be the one the
// pod declares, the probes hit and the Services target.

const K8S = join(REPO, "deploy", "k8s");
const tmp = tempDir("tl-engine-deploy-");
afterAll(() => tmp.remove());

// A loose view of the Kubernetes objects this test reads.
type Obj = Record<string, any>;

function load(file: string): Obj[] {
  return parseAllDocuments(readFileSync(join(K8S, file), "utf8"))
    .map((d) => d.toJS() as Obj)
    .filter((d) => d !== null);
}

const kustomization = load("kustomization.yaml")[0]!;
const objects = (kustomization.resources as string[]).flatMap(load);
const byKind = (kind: string) => objects.filter((o) => o.kind === kind);
const workloads = byKind("Deployment");
const services = byKind("Service");
const workload = (name: string) => workloads.find((w) => w.metadata.name === name)!;

/** What kubelet does to args: $(VAR) from the container's env; fieldRefs get sample values. */
function expandArgs(pod: Obj, c: Obj): string[] {
  const samples: Record<string, string> = {
    "metadata.name": `${pod.metadata.labels["app.kubernetes.io/component"]}-7d9f8-x2kq4`,
    "status.podIP": "10.244.1.7",
  };
  const env = new Map<string, string>();
  for (const e of c.env ?? []) {
    const v = e.value ?? samples[e.valueFrom?.fieldRef?.fieldPath];
    expect(v, `env ${e.name} of ${c.name}`).toBeDefined();
    env.set(e.name, v);
  }
  return (c.args as string[]).map((a) =>
    a.replace(/\$\((\w+)\)/g, (_, name: string) => {
      expect(env.has(name), `$(${name}) in ${c.name}'s args is defined in its env`).toBe(true);
      return env.get(name)!;
    }),
  );
}

/** The effective config a container starts with: its args, with --config read from the mounted ConfigMap. */
function effectiveConfig(pod: Obj, c: Obj): Config {
  const args = expandArgs(pod, c);
  const i = args.indexOf("--config");
  if (i >= 0) {
    const path = args[i + 1]!;
    const mount = (c.volumeMounts as Obj[]).find((m) => path.startsWith(m.mountPath + "/"));
    expect(mount, `a volume mounted over ${path}`).toBeDefined();
    const volume = (pod.spec.volumes as Obj[]).find((v) => v.name === mount!.name)!;
    const cm = byKind("ConfigMap").find((m) => m.metadata.name === volume.configMap?.name);
    expect(cm, `ConfigMap ${volume.configMap?.name}`).toBeDefined();
    const key = path.slice(mount!.mountPath.length + 1);
    expect(Object.keys(cm!.data)).toContain(key);
    const local = join(tmp.path, `${c.name}-${key}`);
    writeFileSync(local, cm!.data[key]);
    args[i + 1] = local;
  }
  const parsed = parseArgs(args);
  // main refuses options it does not know; so must the manifests.
  expect({ container: c.name, unknown: [...parsed.rest.keys()] }).toEqual({ container: c.name, unknown: [] });
  expect(parsed.help).toBe(false);
  return parsed.config;
}

/** containerPort for a probe's or Service's port: a number, or the name of a declared port. */
function resolvePort(c: Obj, port: number | string): number {
  if (typeof port === "number") return port;
  const p = (c.ports as Obj[]).find((x) => x.name === port);
  expect(p, `port named ${port} on ${c.name}`).toBeDefined();
  return p!.containerPort;
}

function selects(selector: Record<string, string>, labels: Record<string, string>): boolean {
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}

interface Pod {
  name: string;
  template: Obj;
  container: Obj;
  config: Config;
  /** listen key -> port the process binds */
  listens: Map<string, number>;
}

const pods: Pod[] = workloads.map((w) => {
  const template = w.spec.template;
  expect(template.spec.containers.length).toBe(1);
  const container = template.spec.containers[0];
  const config = effectiveConfig(template, container);
  const e = config.engine;
  const g = config.gateway;
  const listens = new Map<string, number>();
  if (config.role === "gateway") {
    listens.set("http_listen", parseAddr(String(g.http_listen)).port);
    listens.set("registry_listen", parseAddr(String(g.registry_listen)).port);
  } else {
    listens.set("http_listen", parseAddr(String(e.http_listen)).port);
    listens.set("grpc_listen", parseAddr(String(e.grpc_listen)).port);
    if (config.role !== "prefill") {
      listens.set("kv_listen", parseAddr(String(e.kv_listen)).port);
      if (e.kv_data_listen) listens.set("kv_data_listen", parseAddr(String(e.kv_data_listen)).port);
    }
  }
  return { name: w.metadata.name, template, container, config, listens };
});
const pod = (name: string) => pods.find((p) => p.name === name)!;

test("deploy manifests parse and cover the layout", () => {
  // Every manifest in the folder is applied (kind-config is for `kind`, not kubectl).
  const files = readdirSync(K8S).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml" && f !== "kind-config.yaml");
  expect([...kustomization.resources].sort()).toEqual(files.sort());
  const ns = byKind("Namespace")[0]!.metadata.name;
  expect(kustomization.namespace).toBe(ns);
  // Cluster-scoped objects have no namespace; every other one is in the app's.
  const clusterScoped = ["Namespace", "PersistentVolume"];
  for (const o of objects) expect(o.metadata.namespace, `${o.kind}/${o.metadata.name}`).toBe(clusterScoped.includes(o.kind) ? undefined : ns);

  expect(pods.map((p) => [p.name, p.config.role, workload(p.name).spec.replicas])).toEqual([
    ["gateway", "gateway", 2],
    ["prefill", "prefill", 1],
    ["decode", "decode", 2],
  ]);
  // One image everywhere: the compiled binary is every role.
  expect(new Set(pods.map((p) => p.container.image)).size).toBe(1);
  for (const w of workloads) {
    expect(selects(w.spec.selector.matchLabels, w.spec.template.metadata.labels)).toBe(true);
    // The image's ENTRYPOINT is the binary; a command here would bypass it.
    expect(w.spec.template.spec.containers[0].command).toBeUndefined();
  }
});

test("deploy args are cli options and ports agree", () => {
  for (const p of pods) {
    const c = p.container;
    const declared = (c.ports as Obj[]).map((x) => x.containerPort as number).sort();
    // Every bound port declared, and nothing declared that nothing binds.
    expect({ pod: p.name, ports: declared }).toEqual({ pod: p.name, ports: [...p.listens.values()].sort() });
    const http = p.listens.get("http_listen")!;
    // Readiness turns 503 while draining; liveness stays up (a draining engine must not be restarted).
    for (const [probe, path] of [
      ["readinessProbe", "/health"],
      ["livenessProbe", "/health/live"],
    ] as const) {
      expect(c[probe]?.httpGet?.path, `${p.name} ${probe}`).toBe(path);
      expect(resolvePort(c, c[probe].httpGet.port)).toBe(http);
    }
    if (c.startupProbe) expect(resolvePort(c, c.startupProbe.httpGet.port)).toBe(http);
    expect(Number(p.template.metadata.annotations?.["prometheus.io/port"])).toBe(http);
    // Other pods connect: bind every interface.
    for (const key of p.listens.keys()) {
      const section = p.config.role === "gateway" ? p.config.gateway : p.config.engine;
      expect(parseAddr(String(section[key])).host, `${p.name} ${key}`).toBe("0.0.0.0");
    }
  }
});

test("deploy engines advertise their pod ip and beat to the registry service", () => {
  const gw = pod("gateway");
  const registryPort = gw.listens.get("registry_listen")!;
  for (const p of [pod("prefill"), pod("decode")]) {
    // Bound on 0.0.0.0, an engine must tell others its pod IP.
    expect(p.config.engine.advertise_host).toBe("10.244.1.7");
    const env = (p.container.env as Obj[]).find((e) => `$(${e.name})` === p.container.args[p.container.args.indexOf("--advertise-host") + 1]);
    expect(env?.valueFrom?.fieldRef?.fieldPath).toBe("status.podIP");
    // A DNS name re-resolved every beat, so each engine beats to every gateway replica.
    const registry = String(p.config.engine.gateway_registry);
    expect(registry.startsWith("dns:"), `${p.name}'s gateway_registry is a dns: name`).toBe(true);
    const { host, port } = parseAddr(registry.slice(4));
    const ns = gw.template.metadata.namespace ?? workload("gateway").metadata.namespace;
    const svcName = host.replace(new RegExp(`\\.${ns}(\\.svc(\\.cluster\\.local)?)?$`), "");
    const svc = services.find((s) => s.metadata.name === svcName);
    expect(svc, `Service ${svcName} named by ${p.name}'s gateway_registry`).toBeDefined();
    // The gateway is not ready until engines registered through this Service: it must not wait for readiness.
    expect(svc!.spec.publishNotReadyAddresses, `${svcName} publishNotReadyAddresses`).toBe(true);
    expect(selects(svc!.spec.selector, gw.template.metadata.labels)).toBe(true);
    // Headless, so the name yields every replica; not-ready replicas too, which need beats to become ready.
    expect([svc!.spec.clusterIP, svc!.spec.publishNotReadyAddresses]).toEqual(["None", true]);
    const sp = (svc!.spec.ports as Obj[]).find((x) => x.port === port);
    expect(sp, `${svcName} serves port ${port}`).toBeDefined();
    expect(resolvePort(gw.container, sp!.targetPort ?? sp!.port)).toBe(registryPort);
  }
});

test("deploy gateway disaggregates by its own choice", () => {
  const g = pod("gateway").config;
  // The manifests say where a prompt is prefilled instead of inheriting a default meant elsewhere.
  expect(g.given.has("gateway.disagg_min_uncached_tokens")).toBe(true);
  // The README's example model (stories15M) has a 256-token context: the default threshold (512)
  // would prefill every request on its decode engine and leave the prefill Deployment idle.
  const context = 256;
  expect(neverDisaggregates(GATEWAY_CONFIG_DEFAULTS.disagg_min_uncached_tokens, context)).toContain("prefill engines sit idle");
  expect(neverDisaggregates(Number(g.gateway.disagg_min_uncached_tokens), context)).toBeNull();
});

test("deploy services and kind reach the gateway", () => {
  const gw = pod("gateway");
  for (const s of services) {
    const target = pods.find((p) => selects(s.spec.selector, p.template.metadata.labels));
    expect(target, `pods behind Service ${s.metadata.name}`).toBeDefined();
    for (const sp of s.spec.ports as Obj[]) expect([...target!.listens.values()]).toContain(resolvePort(target!.container, sp.targetPort ?? sp.port));
  }
  const front = services.find((s) => s.spec.type === "NodePort")!;
  const http = (front.spec.ports as Obj[])[0]!;
  expect(resolvePort(gw.container, http.targetPort)).toBe(gw.listens.get("http_listen")!);
  const kind = load("kind-config.yaml")[0]!;
  expect(kind.kind).toBe("Cluster");
  expect(kind.apiVersion).toBe("kind.x-k8s.io/v1alpha4");
  const mappings = (kind.nodes as Obj[]).flatMap((n) => n.extraPortMappings ?? []);
  expect(mappings.map((m) => m.containerPort)).toContain(http.nodePort);
  expect((kind.nodes as Obj[]).filter((n) => n.role === "worker").length).toBeGreaterThanOrEqual(2);
});

test("deploy drain fits the grace period", () => {
  for (const p of pods) {
    const spec = p.template.spec;
    const pause = p.container.lifecycle?.preStop?.sleep?.seconds;
    expect(pause, `${p.name} preStop pause`).toBeGreaterThan(0);
    // Kubelet counts the preStop pause inside the grace period, then SIGKILLs.
    const drain = Number((p.config.role === "gateway" ? p.config.gateway : p.config.engine).drain_timeout_s);
    expect(spec.terminationGracePeriodSeconds, p.name).toBeGreaterThan(pause + drain);
  }
});

test("deploy gateway replicas roll without a gap", () => {
  const gw = workload("gateway");
  expect(gw.spec.replicas).toBeGreaterThanOrEqual(2);
  // A rollout adds the new replica before draining an old one.
  expect(gw.spec.strategy).toEqual({ type: "RollingUpdate", rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } });
  // Voluntary disruptions leave at least one replica serving, and never block all of them.
  const pdb = byKind("PodDisruptionBudget").find((b) => selects(b.spec.selector.matchLabels, gw.spec.template.metadata.labels));
  expect(pdb, "a PodDisruptionBudget over the gateway").toBeDefined();
  expect(pdb!.spec.minAvailable).toBeGreaterThanOrEqual(1);
  expect(pdb!.spec.minAvailable).toBeLessThan(gw.spec.replicas);
});

/** The Dockerfile's instructions by stage (comments and continuations folded), and its .dockerignore. */
function dockerfile(): { stages: string[][]; ignore: string[] } {
  const text = readFileSync(join(REPO, "deploy", "Dockerfile"), "utf8").replace(/\\\n/g, " ");
  const stages: string[][] = [];
  for (const line of text.split("\n").map((l) => l.trim())) {
    if (line === "" || line.startsWith("#")) continue;
    if (line.startsWith("FROM ")) stages.push([]);
    stages.at(-1)!.push(line.replace(/\s+/g, " "));
  }
  const ignore = readFileSync(join(REPO, "deploy", "Dockerfile.dockerignore"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "" && !l.startsWith("#"));
  return { stages, ignore };
}

test("deploy dockerfile runs the compiled binary", () => {
  const { stages } = dockerfile();
  const [build, run] = [stages[0]!, stages.at(-1)!];
  // The build stage compiles what `npm run build` compiles.
  const script = (JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.build!;
  const [entry, outfile] = [/--compile (.+?) --outfile/.exec(script)![1]!, /--outfile (\S+)/.exec(script)![1]!];
  const compile = build.find((l) => l.includes("bun build --compile"))!;
  expect(compile).toContain(` ${entry} --outfile ${outfile}`);
  const workdir = build.find((l) => l.startsWith("WORKDIR "))!.split(" ")[1]!;
  const copy = run.find((l) => l.startsWith("COPY --from="))!.split(" ");
  expect(copy.at(-2)).toBe(`${workdir}/${outfile}`);
  const entrypoint = JSON.parse(run.find((l) => l.startsWith("ENTRYPOINT "))!.slice("ENTRYPOINT ".length)) as string[];
  expect(entrypoint).toEqual([copy.at(-1)!]);
  const exposed = run
    .find((l) => l.startsWith("EXPOSE "))!
    .split(" ")
    .slice(1)
    .map(Number);
  for (const p of pods) for (const port of p.listens.values()) expect(exposed).toContain(port);
});

test("deploy image is compiled for the target platform", () => {
  const { stages, ignore } = dockerfile();
  const build = stages[0]!;
  // The builder runs natively and cross-compiles: bun's --target for each TARGETARCH.
  expect(build[0]).toStartWith("FROM --platform=$BUILDPLATFORM ");
  expect(build).toContain("ARG TARGETARCH");
  const compile = build.find((l) => l.includes("bun build --compile"))!;
  expect(compile).toContain('case "$TARGETARCH" in');
  expect(compile).toContain("amd64) target=bun-linux-x64 ;;");
  expect(compile).toContain("arm64) target=bun-linux-arm64 ;;");
  expect(compile).toContain('--target="$target"');
  // An unknown arch stops the build instead of shipping the builder's binary.
  expect(compile).toMatch(/\*\) .*exit 1 ;;/);
  // Everything the build stage copies is in the build context the .dockerignore leaves.
  expect(ignore[0]).toBe("*");
  const kept = ignore.filter((l) => l.startsWith("!")).map((l) => l.slice(1).replace(/\/$/, ""));
  for (const line of build.filter((l) => l.startsWith("COPY "))) {
    for (const src of line.split(" ").slice(1, -1)) expect(kept, `COPY ${src}`).toContain(src);
  }
});

/**
 * A .dockerignore pattern as Docker reads it (Go's filepath.Match per segment, `**` across
 * segments, a trailing slash dropped); it matches a path or any directory above it.
 */
function ignoreRule(line: string): { negate: boolean; re: RegExp } {
  const negate = line.startsWith("!");
  const pattern = (negate ? line.slice(1) : line).trim().replace(/^\/+|\/+$/g, "");
  let re = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*" && pattern[i + 1] === "*") {
      re += ".*";
      i++;
    } else if (c === "*") re += "[^/]*";
    else if (c === "?") re += "[^/]";
    else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
  }
  return { negate, re: new RegExp(`^${re}$`) };
}

/** The files of this checkout `docker build .` would send, by the ignore file's rules: the last rule that matches decides. */
function buildContext(ignore: string[]): string[] {
  const rules = ignore.map(ignoreRule);
  const listed = Bun.spawnSync(["git", "ls-files", "--cached", "--others", "--exclude-standard"], { cwd: REPO });
  const files = listed.stdout
    .toString()
    .split("\n")
    .filter((f) => f !== "" && existsSync(join(REPO, f)));
  return files.filter((file) => {
    const parts = file.split("/");
    const prefixes = parts.map((_, i) => parts.slice(0, i + 1).join("/"));
    let kept = true;
    for (const r of rules) if (prefixes.some((p) => r.re.test(p))) kept = r.negate;
    return kept;
  });
}

test("deploy build context compiles the binary", async () => {
  const { stages, ignore } = dockerfile();
  const context = buildContext(ignore);
  // The model weights and the kind volume's files never travel; what the binary embeds does.
  expect(context).toContain("models/tl-kjv-small/tokenizer.json");
  expect(context.some((f) => f.startsWith("test/") || f.startsWith("bench/") || f.startsWith("deploy/"))).toBe(false);
  // The build stage, run in a folder holding only the context: its COPY lines, the install, the compile.
  const work = join(tmp.path, "build");
  mkdirSync(work, { recursive: true });
  const build = stages[0]!;
  for (const line of build.filter((l) => l.startsWith("COPY "))) {
    const [dest, ...srcs] = line.split(" ").slice(1).reverse();
    for (const src of srcs) {
      const files = context.filter((f) => f === src || f.startsWith(`${src}/`));
      expect(files.length, `COPY ${src}: in the build context`).toBeGreaterThan(0);
      for (const f of files) {
        const to = dest!.endsWith("/") ? join(work, dest!, f.slice(f.lastIndexOf("/") + 1)) : join(work, dest!, f.slice(src.length));
        mkdirSync(dirname(to), { recursive: true });
        copyFileSync(join(REPO, f), to);
      }
    }
  }
  // RUN npm ci installs package-lock.json: this checkout's install of the same lockfile stands in.
  expect(build).toContain("RUN npm ci --no-audit --no-fund");
  symlinkSync(join(REPO, "node_modules"), join(work, "node_modules"));
  const compile = build.find((l) => l.includes("bun build --compile"))!.slice("RUN ".length);
  const arch = process.arch === "arm64" ? "arm64" : "amd64";
  const run = Bun.spawn(["sh", "-c", compile], { cwd: work, env: { ...process.env, TARGETARCH: arch }, stdout: "pipe", stderr: "pipe" });
  const [code, err] = [await run.exited, await new Response(run.stderr).text()];
  expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
  expect(statSync(join(work, "dist", "engine")).size).toBeGreaterThan(1 << 20);
}, 120_000);

test("deploy pods run as the images numeric user", () => {
  const run = dockerfile().stages.at(-1)!;
  const user = run.find((l) => l.startsWith("USER "))!.split(" ")[1]!;
  // The kubelet can only prove runAsNonRoot for a numeric user: uid:gid, neither root.
  expect(user).toMatch(/^[1-9]\d*:[1-9]\d*$/);
  const [uid, gid] = user.split(":").map(Number);
  for (const p of pods) {
    const sc = p.template.spec.securityContext;
    expect({ pod: p.name, runAsNonRoot: sc.runAsNonRoot, runAsUser: sc.runAsUser, runAsGroup: sc.runAsGroup }).toEqual({
      pod: p.name,
      runAsNonRoot: true,
      runAsUser: uid,
      runAsGroup: gid,
    });
    expect(p.container.securityContext.readOnlyRootFilesystem).toBe(true);
  }
});

test("deploy model comes from a read only volume", () => {
  const claims = byKind("PersistentVolumeClaim");
  const volumes = byKind("PersistentVolume");
  const kind = load("kind-config.yaml")[0]!;
  for (const p of pods) {
    const section = p.config.role === "gateway" ? p.config.gateway : p.config.engine;
    for (const key of ["model", "tokenizer"]) {
      const path = String(section[key]);
      expect(path, `${p.name} ${key}`).toStartWith("/");
      const mount = (p.container.volumeMounts as Obj[]).find((m) => path.startsWith(m.mountPath + "/"));
      expect(mount, `${p.name}: a volume mounted over ${path}`).toBeDefined();
      expect(mount!.readOnly).toBe(true);
      const volume = (p.template.spec.volumes as Obj[]).find((v) => v.name === mount!.name)!;
      const claim = claims.find((c) => c.metadata.name === volume.persistentVolumeClaim?.claimName);
      expect(claim, `${p.name}: the claim behind ${path}`).toBeDefined();
      expect(claim!.spec.accessModes).toContain("ReadOnlyMany");
      // The claim binds the volume kind's nodes mount from the host, on every node.
      const pv = volumes.find((v) => v.metadata.name === claim!.spec.volumeName)!;
      expect(pv.spec.storageClassName).toBe(claim!.spec.storageClassName);
      for (const node of kind.nodes as Obj[]) {
        expect(
          (node.extraMounts as Obj[] | undefined)?.map((m) => m.containerPath),
          `kind ${node.role} mounts ${pv.spec.hostPath.path}`,
        ).toContain(pv.spec.hostPath.path);
      }
    }
  }
});

test("deploy runs mtls from secrets behind network policies", () => {
  for (const p of pods) {
    const section = p.config.role === "gateway" ? p.config.gateway : p.config.engine;
    // Every pod binds 0.0.0.0: it must run mutual TLS, from its role's Secret.
    const files = ["tls_cert", "tls_key", "tls_ca"].map((k) => String(section[k]));
    const mount = (p.container.volumeMounts as Obj[]).find((m) => files.every((f) => f.startsWith(m.mountPath + "/")));
    expect(mount, `${p.name}: the tls files lie under one mount`).toBeDefined();
    const volume = (p.template.spec.volumes as Obj[]).find((v) => v.name === mount!.name)!;
    expect(volume.secret?.secretName).toBe(`tl-engine-${p.config.role}-tls`);
    expect(files.map((f) => f.slice(mount!.mountPath.length + 1))).toEqual(["tls.crt", "tls.key", "ca.crt"]);
    expect(section.insecure).not.toBe(true);
  }
  // Only prefill engines (and the gateway, for Release) reach the decode engines' KV ports;
  // only the gateway reaches the engines' control ports.
  const policies = byKind("NetworkPolicy");
  const ingress = (component: string) =>
    policies.find((n) => n.spec.podSelector.matchLabels?.["app.kubernetes.io/component"] === component)!.spec.ingress as Obj[];
  const allowed = (component: string, port: number) =>
    ingress(component)
      .filter((r) => (r.ports as Obj[]).some((x) => x.port === port))
      .flatMap((r) =>
        (r.from ?? [{ podSelector: { matchLabels: { "app.kubernetes.io/component": "*" } } }]).map(
          (f: Obj) => f.podSelector.matchLabels?.["app.kubernetes.io/component"] ?? "engines",
        ),
      )
      .sort();
  expect(allowed("decode", 50062)).toEqual(["prefill"]);
  expect(allowed("decode", 50061)).toEqual(["gateway", "prefill"]);
  expect(allowed("decode", 50051)).toEqual(["gateway"]);
  expect(allowed("prefill", 50051)).toEqual(["gateway"]);
  expect(allowed("gateway", 50050)).toEqual(["engines"]);
  expect(policies.some((n) => Object.keys(n.spec.podSelector.matchLabels).length === 1 && n.spec.ingress === undefined)).toBe(true);
});
