import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readyLineOf } from "../../src/cli/spawn-role.ts";

export const REPO = join(import.meta.dir, "..", "..");

/** A child process whose stdout is read line by line and whose stderr is kept for messages. */
export interface Proc {
  readonly proc: Bun.Subprocess<"ignore", "pipe", "pipe">;
  readonly lines: string[];
  stderr(): string;
  /** Resolves with the first stdout line (seen or to come) that matches; rejects on exit or timeout. */
  waitLine(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** The JSON `{"msg":"ready",...}` line an engine or gateway prints once it serves. */
  ready(timeoutMs?: number): Promise<Record<string, unknown>>;
}

const live = new Set<Bun.Subprocess>();

export function spawnProc(cmd: string[], opts: { cwd?: string } = {}): Proc {
  const proc = Bun.spawn(cmd, { cwd: opts.cwd ?? REPO, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  live.add(proc);
  void proc.exited.then(() => live.delete(proc));
  const lines: string[] = [];
  const waiters = new Set<() => void>();
  let ended = false;
  void (async () => {
    let buf = "";
    const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true as const }));
      if (done) break;
      buf += value;
      const parts = buf.split("\n");
      buf = parts.pop()!;
      lines.push(...parts);
      for (const w of waiters) w();
    }
    ended = true;
    for (const w of waiters) w();
  })();
  let err = "";
  void (async () => {
    for await (const chunk of proc.stderr.pipeThrough(new TextDecoderStream())) err += chunk;
  })().catch(() => {});
  const waitLine = (match: (line: string) => boolean, timeoutMs = 20_000) =>
    new Promise<string>((resolve, reject) => {
      const check = () => {
        const hit = lines.find(match);
        if (hit !== undefined) return finish(() => resolve(hit));
        if (ended) return finish(() => reject(new Error(`${cmd.join(" ")} ended its output (exit ${proc.exitCode}) without the line; stderr:\n${err}`)));
      };
      const timer = setTimeout(
        () => finish(() => reject(new Error(`no such line within ${timeoutMs} ms from ${cmd.join(" ")}; stdout:\n${lines.join("\n")}\nstderr:\n${err}`))),
        timeoutMs,
      );
      const finish = (f: () => void) => {
        clearTimeout(timer);
        waiters.delete(check);
        f();
      };
      waiters.add(check);
      check();
    });
  return {
    proc,
    lines,
    stderr: () => err,
    waitLine,
    async ready(timeoutMs) {
      return readyLineOf(await waitLine((l) => readyLineOf(l) !== null, timeoutMs))!;
    },
  };
}

/** SIGKILLs every process spawnProc started that is still running, and their children; for afterAll. */
export async function killAll(): Promise<void> {
  const procs = [...live];
  for (const p of procs) killTree(p.pid);
  await Promise.all(procs.map((p) => p.exited));
}

/** True while a process with this pid runs (signal 0 only checks); a zombie (exited, not yet reaped) counts as gone. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
  return statOf(pid)?.state !== "Z";
}

/** State and parent of a process from /proc (Linux); null where there is none. */
function statOf(pid: number): { state: string; ppid: number } | null {
  try {
    // The comm field may hold spaces and parens: the state and ppid follow its last ')'.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return { state: state!, ppid: Number(ppid) };
  } catch {
    return null;
  }
}

/** Every live process below `pid`, children first (Linux /proc; empty elsewhere). */
export function descendantsOf(pid: number): number[] {
  const out: number[] = [];
  for (let frontier = [pid]; frontier.length > 0; ) {
    frontier = frontier.flatMap(childrenOf).filter(alive);
    out.push(...frontier);
  }
  return out;
}

/** Pids whose parent is `pid` (Linux /proc; empty elsewhere): cleanup for a cluster that failed before it listed them. */
export function childrenOf(pid: number): number[] {
  const out: number[] = [];
  let entries: string[] = [];
  try {
    entries = readdirSync("/proc").filter((d) => /^\d+$/.test(d));
  } catch {
    return out;
  }
  for (const d of entries) if (statOf(Number(d))?.ppid === pid) out.push(Number(d));
  return out;
}

/** SIGKILLs a process and its direct children; for finally blocks after a failure. */
export function killTree(pid: number): void {
  for (const p of [...childrenOf(pid), pid]) {
    try {
      process.kill(p, "SIGKILL");
    } catch {}
  }
}

/** Waits until none of `pids` exists; returns those still alive at the deadline. */
export async function waitGone(pids: readonly number[], timeoutMs = 10_000): Promise<number[]> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const left = pids.filter(alive);
    if (left.length === 0 || Date.now() > end) return left;
    await Bun.sleep(25);
  }
}

/** Resolves with the exit code, or rejects when the process outlives the deadline. */
export async function exitWithin(p: Bun.Subprocess, timeoutMs: number): Promise<number> {
  let timer: Timer | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`pid ${p.pid} still running after ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([p.exited, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export function tempDir(prefix: string): { path: string; remove(): void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/** Reads an SSE completion stream raw: content, the finish reason, whether [DONE] came, any error event, a broken connection. */
export async function readSse(
  res: Response,
  onEvent?: (obj: Record<string, unknown>) => void,
): Promise<{ text: string; events: number; finish: string | null; done: boolean; error: string | null; broke: string | null }> {
  let text = "";
  let finish: string | null = null;
  let events = 0;
  let done = false;
  let error: string | null = null;
  let broke: string | null = null;
  let buf = "";
  try {
    for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const parts = buf.split("\n\n");
      buf = parts.pop()!;
      for (const part of parts) {
        if (!part.startsWith("data: ")) continue;
        const data = part.slice(6);
        if (data === "[DONE]") {
          done = true;
          continue;
        }
        const obj = JSON.parse(data) as Record<string, unknown> & {
          error?: { message: string };
          choices?: { delta?: { content?: string }; text?: string; finish_reason?: string | null }[];
        };
        events++;
        if (obj.error) error = obj.error.message;
        text += obj.choices?.[0]?.delta?.content ?? obj.choices?.[0]?.text ?? "";
        finish = obj.choices?.[0]?.finish_reason ?? finish;
        onEvent?.(obj);
      }
    }
  } catch (e) {
    broke = e instanceof Error ? e.message : String(e);
  }
  return { text, events, finish, done, error, broke };
}
