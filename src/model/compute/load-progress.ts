/**
 * A progress line for loads longer than a second: "loading NAME: 312/1024 MiB" at most once a
 * second, then a final line, so a slow disk is visible and a fast load prints nothing.
 */
export class LoadProgress {
  private done = 0;
  private readonly start: number;
  private lastPrint: number;
  private printed = false;

  constructor(
    private readonly label: string,
    private readonly total: number,
    private readonly write: (line: string) => void = (l) => process.stderr.write(l + "\n"),
    private readonly now: () => number = () => performance.now(),
    /** What the line says is happening, and that it is done. */
    private readonly verbs: readonly [string, string] = ["loading", "loaded"],
  ) {
    this.start = now();
    this.lastPrint = this.start;
  }

  add(bytes: number): void {
    this.done += bytes;
    const t = this.now();
    if (t - this.start < 1000 || t - this.lastPrint < 1000) return;
    this.lastPrint = t;
    this.printed = true;
    this.write(`${this.verbs[0]} ${this.label}: ${mib(this.done)}/${mib(this.total)} MiB`);
  }

  finish(): void {
    if (this.printed) this.write(`${this.verbs[1]} ${this.label}: ${mib(this.done)} MiB in ${((this.now() - this.start) / 1000).toFixed(1)} s`);
  }
}

const mib = (n: number) => (n / 1048576).toFixed(0);
