import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Certificate, ClusterIssuer, Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Service } from "kubernetes-models/v1";
import { parseAllDocuments } from "yaml";
import { REPO } from "./procs.ts";

// Every object in deploy/k8s (what `kubectl apply -k deploy/k8s` sends, and the optional
// manifests beside it, such as cert-manager's), checked against the API's own schemas
// (types, formats, required fields) before any cluster sees it. kind-config.yaml is
// kind's and kustomization.yaml kustomize's: neither is an API object.

const K8S = join(REPO, "deploy", "k8s");

/** The schema for each apiVersion/kind the manifests use; a kind missing here fails the test. */
const SCHEMAS: Record<string, new (data: any) => { validate(): void }> = {
  "v1/Namespace": Namespace,
  "v1/ConfigMap": ConfigMap,
  "v1/Service": Service,
  "v1/PersistentVolume": PersistentVolume,
  "v1/PersistentVolumeClaim": PersistentVolumeClaim,
  "apps/v1/Deployment": Deployment,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "networking.k8s.io/v1/NetworkPolicy": NetworkPolicy,
  "cert-manager.io/v1/Certificate": Certificate,
  "cert-manager.io/v1/Issuer": Issuer,
  "cert-manager.io/v1/ClusterIssuer": ClusterIssuer,
};

type Obj = Record<string, any>;

function parseFile(file: string): Obj[] {
  const docs = parseAllDocuments(readFileSync(join(K8S, file), "utf8"));
  return docs
    .map((d, i) => {
      expect({ file, doc: i, errors: d.errors.map((e) => e.message) }).toEqual({ file, doc: i, errors: [] });
      return d.toJS() as Obj;
    })
    .filter((o) => o !== null);
}

const NOT_API_OBJECTS = ["kind-config.yaml", "kustomization.yaml"];
const files = (readdirSync(K8S, { recursive: true }) as string[]).filter((f) => f.endsWith(".yaml") && !NOT_API_OBJECTS.includes(f)).sort();
const documents = files.flatMap((file) => parseFile(file).map((obj) => ({ file, obj })));

test("deploy schema check reads every applied manifest", () => {
  // Everything kustomize applies is among what is validated here.
  const kustomization = parseFile("kustomization.yaml")[0]!;
  for (const r of kustomization.resources as string[]) expect(files).toContain(r);
});

function validate(obj: Obj): void {
  const Schema = SCHEMAS[`${obj.apiVersion}/${obj.kind}`];
  if (!Schema) throw new Error(`no schema for ${obj.apiVersion} ${obj.kind}`);
  new Schema(obj).validate();
}

test("deploy manifests validate against kubernetes schemas", () => {
  expect(documents.length).toBeGreaterThan(0);
  for (const { file, obj } of documents) {
    let error: string | null = null;
    try {
      validate(obj);
    } catch (e) {
      error = String(e);
    }
    expect({ file, object: `${obj.kind}/${obj.metadata?.name}`, error }).toEqual({ file, object: `${obj.kind}/${obj.metadata?.name}`, error: null });
  }
});

test("deploy schema check is live", () => {
  // A user name where the API wants a uid, a port name where it wants a number, a
  // Deployment without a selector: each refused.
  const deployment = documents.find((d) => d.obj.kind === "Deployment")!.obj;
  const broken: ((d: Obj) => void)[] = [
    (d) => (d.spec.template.spec.securityContext.runAsUser = "nonroot"),
    (d) => (d.spec.template.spec.containers[0].ports[0].containerPort = "http"),
    (d) => delete d.spec.selector,
  ];
  for (const breakIt of broken) {
    const copy = structuredClone(deployment);
    breakIt(copy);
    expect(() => validate(copy)).toThrow();
  }
  expect(() => validate({ apiVersion: "v1", kind: "Pod", metadata: { name: "x" } })).toThrow("no schema for v1 Pod");
});
