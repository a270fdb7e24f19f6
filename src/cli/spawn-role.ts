import type { Role } from "./options.ts";

/** Any free loopback port, chosen by the OS at bind time: nothing can take it between a probe and the bind. */
export const ANY_PORT = "127.0.0.1:0";

/**
 * `--role <role>` and every listen address that role binds, each on ANY_PORT (the role says
 * which ports it got in its ready line), then `extra`: how the cluster, tests and benches
 * start a role on loopback.
 */
export function roleArgs(role: Role, extra: readonly string[] = []): string[] {
  const listen =
    role === "gateway"
      ? ["--http-listen", ANY_PORT, "--registry-listen", ANY_PORT]
      : ["--http-listen", ANY_PORT, "--grpc-listen", ANY_PORT, "--kv-listen", ANY_PORT];
  return ["--role", role, ...listen, ...extra];
}

/**
 * The JSON `{"msg":"ready",...}` line every role prints once it serves (with its
 * addresses), or null for any other line.
 */
export function readyLineOf(line: string): Record<string, unknown> | null {
  if (!line.startsWith("{")) return null;
  try {
    const obj = JSON.parse(line) as Record<string, unknown>;
    return obj.msg === "ready" ? obj : null;
  } catch {
    return null;
  }
}

/** A role running as its own process: `ready` resolves with its ready line, rejects if it exits first. */
export interface RoleProcess {
  name: string;
  proc: Bun.Subprocess<"ignore", "pipe", "pipe" | "inherit">;
  ready: Promise<Record<string, unknown>>;
  /** its last stderr lines, when stderr is kept ("tail") */
  tail: string[];
}

export interface SpawnRoleOptions {
  env?: Record<string, string | undefined>;
  /** "inherit" (default): the child writes to ours; "tail": keep its last 20 lines for the error a failed start reports. */
  stderr?: "inherit" | "tail";
}

/** Starts `cmd` (an engine binary and its flags) and reads its stdout until the ready line, then drains it so the child never blocks on a full pipe. */
export function spawnRole(name: string, cmd: string[], opts: SpawnRoleOptions = {}): RoleProcess {
  const tailed = opts.stderr === "tail";
  const proc = Bun.spawn(cmd, { stdin: "ignore", stdout: "pipe", stderr: tailed ? "pipe" : "inherit", ...(opts.env ? { env: opts.env } : {}) });
  const tail: string[] = [];
  if (tailed) {
    void (async () => {
      const decoder = new TextDecoder();
      for await (const b of proc.stderr as ReadableStream<Uint8Array>) {
        const s = decoder.decode(b, { stream: true });
        tail.push(...s.split("\n").filter((l) => l.length > 0));
        tail.splice(0, Math.max(0, tail.length - 20));
      }
    })().catch(() => {});
  }
  const ready = (async () => {
    const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`${name} exited (code ${await proc.exited}) before it was ready${tail.length > 0 ? `: ${tail.join("\n")}` : ""}`);
      buf += value;
      const lines = buf.split("\n");
      buf = lines.pop() ?? "";
      for (const line of lines) {
        const obj = readyLineOf(line);
        if (obj === null) continue;
        // Keep draining the child's stdout so it never blocks on a full pipe.
        void (async () => {
          for (;;) if ((await reader.read()).done) return;
        })().catch(() => {});
        return obj;
      }
    }
  })();
  return { name, proc, ready, tail };
}
