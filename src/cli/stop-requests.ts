/** The environment variable `engine cluster` sets on every process it starts: its own pid. */
export const PARENT_PID_ENV = "TL_PARENT_PID";

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;

/**
 * Resolves, once, with why this process should stop: SIGINT, SIGTERM, SIGHUP (the
 * terminal or the supervisor went away), or "parent exited" when `parentPid` is given
 * and that process is gone.
 *
 * Bun has no PR_SET_PDEATHSIG, and a parent killed with SIGKILL cannot tell anyone,
 * but the kernel reparents an orphan at once (to init or a subreaper), so a ppid that
 * no longer equals the parent's pid is the sign that holds however the parent died.
 * The poll is one getppid per tick; its timer never keeps the process alive.
 */
export function stopRequests(parentPid?: number, pollMs = 200): Promise<string> {
  return new Promise((resolve) => {
    let timer: Timer | undefined;
    const stop = (why: string) => {
      clearInterval(timer);
      resolve(why);
    };
    for (const sig of SIGNALS) process.on(sig, () => stop(sig));
    if (parentPid === undefined) return;
    const check = () => {
      if (process.ppid !== parentPid) stop("parent exited");
    };
    timer = setInterval(check, pollMs);
    timer.unref();
    // The parent may be gone before this process even looked.
    check();
  });
}

/** The pid `engine cluster` started this process under, if it did. */
export function parentFromEnv(env: Record<string, string | undefined> = process.env): number | undefined {
  const v = env[PARENT_PID_ENV];
  return v !== undefined && /^[1-9]\d*$/.test(v) ? Number(v) : undefined;
}
