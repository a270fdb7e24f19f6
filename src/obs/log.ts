/** JSON lines on stderr; TL_LOG_LEVEL=debug|info|warn|error|silent (default info). */
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 } as const;
type Level = keyof typeof LEVELS;

function threshold(): number {
  const v = (process.env.TL_LOG_LEVEL ?? "info").toLowerCase();
  return LEVELS[(v in LEVELS ? v : "info") as Level];
}

const min = threshold();
let sink: (line: string) => void = (line) => process.stderr.write(line);

/**
 * Sends this process's log lines elsewhere than stderr (the test runner writes them to a file:
 * a passing test that kills a model thread on purpose must not print "model thread died").
 */
export function logTo(to: (line: string) => void): void {
  sink = to;
}

function write(level: Level, msg: string, fields: Record<string, unknown>): void {
  if (LEVELS[level] < min) return;
  const line = JSON.stringify({ ts: new Date().toISOString(), level, msg, ...fields }, (_k, v) => (typeof v === "bigint" ? v.toString() : v));
  sink(line + "\n");
}

export const log = {
  debug: (msg: string, fields: Record<string, unknown> = {}) => write("debug", msg, fields),
  info: (msg: string, fields: Record<string, unknown> = {}) => write("info", msg, fields),
  warn: (msg: string, fields: Record<string, unknown> = {}) => write("warn", msg, fields),
  error: (msg: string, fields: Record<string, unknown> = {}) => write("error", msg, fields),
};
