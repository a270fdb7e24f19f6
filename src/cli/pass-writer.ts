/**
 * Text handed to `out` once per run of the event loop's microtasks: the tokens the engine
 * settles in one pass (a wake of a pipelined decode settles two steps) go out in one write, and
 * each pass's text is written as soon as it ends, so the text still streams token by token.
 */
export class PassWriter {
  private buffered = "";
  private readonly flushNow = (): void => this.flush();

  constructor(private readonly out: (s: string) => void) {}

  write(s: string): void {
    if (s === "") return;
    if (this.buffered === "") queueMicrotask(this.flushNow);
    this.buffered += s;
  }

  flush(): void {
    if (this.buffered === "") return;
    const s = this.buffered;
    this.buffered = "";
    this.out(s);
  }
}
