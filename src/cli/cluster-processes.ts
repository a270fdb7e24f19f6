import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { certFiles, mintCluster, writeCerts } from "./certs.ts";
import { type RoleProcess, spawnRole } from "./spawn-role.ts";
import { PARENT_PID_ENV } from "./stop-requests.ts";
import type { TcpFront } from "./tcp-front.ts";

/**
 * Everything `engine cluster` started: each role's process (added as it starts), the TCP
 * front of several replicas, the ephemeral PKI. `stopAll` ends exactly those, whichever
 * step failed: SIGTERM, then SIGKILL for a process still there after 15 s.
 */
export class ClusterProcesses {
  readonly children: RoleProcess[] = [];
  front: TcpFront | null = null;

  private constructor(readonly pki: string | null) {}

  /** With a fresh CA and one certificate per process (`counts`), unless plaintext. */
  static async create(plaintext: boolean, counts: { prefill: number; decode: number; gateway: number }): Promise<ClusterProcesses> {
    return new ClusterProcesses(plaintext ? null : await ephemeralPki(counts));
  }

  /** The TLS flags of process `id` (none in plaintext). */
  tlsArgs(id: string): string[] {
    if (this.pki === null) return [];
    const files = certFiles(this.pki, { workerId: id });
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", join(this.pki, "ca.crt")];
  }

  /** A role of this same program as its own process, which stops by itself when this one is gone, however it died. */
  start(name: string, args: string[]): RoleProcess {
    const child = spawnRole(name, [...selfCommand(), ...args], { env: { ...process.env, [PARENT_PID_ENV]: String(process.pid) } });
    this.children.push(child);
    return child;
  }

  /** Forgets the last process started (one that failed to start and is gone). */
  dropLast(): void {
    this.children.pop();
  }

  async stopAll(): Promise<void> {
    await this.front?.close();
    for (const c of this.children) c.proc.kill("SIGTERM");
    await Promise.all(this.children.map((c) => Promise.race([c.proc.exited, Bun.sleep(15_000).then(() => c.proc.kill("SIGKILL"))])));
    if (this.pki !== null) rmSync(this.pki, { recursive: true, force: true });
  }
}

/** How to start this same program again: the compiled binary, or bun with this script. */
function selfCommand(): string[] {
  const main = Bun.main;
  return main.startsWith("/$bunfs") || main.includes("~BUN") ? [process.execPath] : [process.execPath, main];
}

/** A CA and one certificate per process, in a fresh 0700 temp directory (keys 0600), for this run only. */
async function ephemeralPki(counts: { prefill: number; decode: number; gateway: number }): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "tl-cluster-pki-"));
  writeCerts(dir, await mintCluster(counts));
  return dir;
}
