// Cluster certificates for tests: one CA with a leaf per role, a second CA ("a stranger's")
// with the same roles, all written to a private temp dir. Minted once per test file.
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { certFiles, issueCert, mintCa, writeCerts, type ClusterCerts } from "../../src/cli/certs.ts";
import type { PeerRole } from "../../src/rpc/peer-identity.ts";
import { loadTlsMaterial, type TlsFiles, type TlsMaterial } from "../../src/rpc/tls-config.ts";

export interface TestPki {
  dir: string;
  cluster: ClusterCerts;
  /** Files of this CA's `<role>-0` leaf (and ca.crt). */
  files(role: PeerRole, workerId?: string): TlsFiles;
  material(role: PeerRole, workerId?: string): TlsMaterial;
  /** The same role under another CA: a stranger's certificate. */
  strangerFiles(role: PeerRole): TlsFiles;
  stranger(role: PeerRole): TlsMaterial;
}

const ROLES: PeerRole[] = ["gateway", "prefill", "decode", "both", "admin"];
let cached: Promise<TestPki> | undefined;

export function testPki(): Promise<TestPki> {
  cached ??= (async () => {
    const dir = mkdtempSync(join(tmpdir(), "tl-pki-"));
    const cluster = await mintCa();
    const other = await mintCa({ caName: "someone else's CA" });
    for (const r of ROLES) {
      await issueCert(cluster, r, `${r}-0`);
      await issueCert(other, r, `${r}-0`);
    }
    writeCerts(join(dir, "cluster"), cluster);
    writeCerts(join(dir, "other"), other);
    const filesIn =
      (sub: string) =>
      (role: PeerRole, workerId = `${role}-0`): TlsFiles => ({
        ...certFiles(join(dir, sub), { workerId }),
        ca: join(dir, sub, "ca.crt"),
      });
    const files = filesIn("cluster");
    const strangerFiles = filesIn("other");
    return {
      dir,
      cluster,
      files,
      material: (role, workerId) => loadTlsMaterial(files(role, workerId)),
      strangerFiles: (role) => strangerFiles(role),
      // A stranger's leaf that trusts our CA: it can verify our servers but ours must refuse it.
      stranger: (role) => ({ ...loadTlsMaterial(strangerFiles(role)), ca: cluster.caPem }),
    };
  })();
  return cached;
}

/** The cluster leaf `workerId` of `role`, issued the first time it is asked for. */
export async function leafFiles(pki: TestPki, role: PeerRole, workerId: string): Promise<TlsFiles> {
  if (pki.cluster.issued.some((c) => c.role === role && c.workerId === workerId)) return pki.files(role, workerId);
  return extraLeaf(pki, role, workerId);
}

/** A leaf of the cluster CA with an arbitrary worker id (issued on demand). */
export async function extraLeaf(pki: TestPki, role: PeerRole, workerId: string): Promise<TlsFiles> {
  const leaf = await issueCert(pki.cluster, role, workerId);
  const f = pki.files(role, workerId);
  writeFileSync(f.cert, leaf.certPem, { mode: 0o600 });
  writeFileSync(f.key, leaf.keyPem, { mode: 0o600 });
  return f;
}
